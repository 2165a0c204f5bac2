"""bench/fidelity.py's public discretisation reads categories in the schema's strings (a synthetic CSV read back
holds Cervical's 0/1 columns as 0 or 0.0, which ``astype(str)`` sent to the unknown code: 2-way TV 0.62 between
Cervical's training rows and the same rows read back)."""

import io

import numpy as np
import pandas as pd

from bench.fidelity import public_codes, two_way_tv
from lightning_dp.data.schema import Schema

SCHEMA = Schema.from_dict({"label": "dx", "missing_values": ["?"], "columns": [
    {"name": "smokes", "type": "categorical", "categories": ["0", "1"], "missing": True},
    {"name": "dx", "type": "categorical", "categories": ["0", "1"]},
    {"name": "years", "type": "continuous", "bounds": [0, 40], "spikes": [0], "missing": True},
]})


def test_a_csv_read_back_gets_the_codes_of_the_frame_it_was_written_from():
    real = pd.DataFrame({"smokes": ["0", "1", np.nan, "0", "1"], "dx": ["1", "0", "0", "1", "0"],
                         "years": [0.0, 12.5, np.nan, 0.0, 39.0]}).astype({"smokes": object, "dx": object})
    back = pd.read_csv(io.StringIO(real.to_csv(index=False)))  # smokes 0.0 / 1.0 / NaN, dx 0 / 1: numbers
    assert back["smokes"].dtype == float and back["dx"].dtype == np.int64
    a, b = public_codes(real, SCHEMA), public_codes(back, SCHEMA)
    for name in SCHEMA.names:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(a["smokes"], [0, 1, 2, 0, 1])  # missing: the code after the categories
    np.testing.assert_array_equal(a["years"], [0, 4, 11, 0, 10])  # spike 0, then 10 bins of width 4, then missing
    assert two_way_tv(real, back, SCHEMA) == 0.0


def test_an_unknown_category_is_not_counted_as_a_known_one():
    frame = pd.DataFrame({"smokes": ["2", "1"], "dx": ["0", "1"], "years": [1.0, 2.0]})
    np.testing.assert_array_equal(public_codes(frame, SCHEMA)["smokes"], [2, 1])
