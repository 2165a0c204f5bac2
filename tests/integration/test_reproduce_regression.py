"""bench/reproduce.py on a tiny regression table: k-fold CV of PSP and the perturbed histogram, written as a section."""

import importlib.util
import sys

import pandas as pd
import pytest

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_reproduce", ROOT / "bench" / "reproduce.py")
rp = sys.modules.setdefault(
    "bench_reproduce", importlib.util.module_from_spec(spec)
)  # a script, not a package
if not hasattr(rp, "reproduce"):
    spec.loader.exec_module(rp)

SHORT = (
    "+model.mechanisms.0.burn_in=1000",
    "+model.mechanisms.0.thin=250",
    "+model.mechanisms.0.draws=9",
    "+model.mechanisms.0.trace_every=50",
    "model.module.num_steps=20",
    "privacy.noise_seed=0",
)
TINY = rp.Table(
    name="tiny_psp",
    title="PSP vs histogram, tiny",
    source="a test table",
    kind="regression",
    privacy=[[100], 1e-5],
    runs=[
        rp.Run(
            label="PSP", experiment="support_points_diabetes", paper="private support points", overrides=SHORT
        ),
        rp.Run(
            label="Histogram",
            experiment=None,
            paper="perturbed histogram",
            overrides=("model=perturbed_histogram", "data=diabetes", "privacy.noise_seed=0"),
        ),
    ],
    paper={
        "private support points": {"better": 20, "on_par": 7, "worse": 0, "settings": 27},
        "perturbed histogram": {},
    },
    compare=[],
    seeds=1,
    notes=["a protocol note"],
    missing=["α = 10,000"],
    bench={"script": "regression_cv", "folds": 2, "budgets": [100], "sizes": [5, 10], "quick_sizes": [5]},
)


@pytest.fixture(scope="module")
def section(tmp_path_factory, single_thread):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rp, "code_version", lambda: "test")  # no git in tests
        sections = rp.reproduce(
            [TINY],
            seeds=1,
            quick=True,
            validate=False,
            extra=[],
            out=tmp_path_factory.mktemp("runs"),
            command="python bench/reproduce.py --table tiny",
            log=lambda _: None,
        )
    return sections["tiny_psp"]


def rows(text: str) -> dict[str, list[str]]:
    """The Markdown table rows of ``text`` by their first cell (the first occurrence)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out.setdefault(cells[0], cells[1:])  # the first table's row when two tables share a label
    return out


def test_regression_section_has_every_method_at_the_quick_size(section):
    table = rows(section)
    assert section.startswith("## tiny_psp: PSP vs histogram, tiny (quick)")
    assert table["method"] == ["ε (target)", "ε spent", "n = 5: MSE median [IQR]"]
    for label in (
        "Real training rows",
        "Support points Y*, ℓ1 (non-private)",
        "Random subset of n rows (non-private)",
        "PSP",
        "PSP + KDE",
        "Histogram",
    ):
        assert label in table, label
    assert table["PSP"][:2] == ["100", "100"] and table["Histogram"][:2] == ["100", "100"]
    assert table["PSP"][2].count("[") == 1 and "refused" not in table["PSP"][2]
    verdicts = rows(section.split("PSP against the perturbed histogram")[1])
    assert verdicts["thesis: private support points (Boston, Diabetes, California)"] == ["20 / 7 / 0", "27"]
    better, on_par, worse = map(int, verdicts["PSP"][0].split(" / "))
    assert better + on_par + worse == int(verdicts["PSP"][1]) == 1
    assert "2-fold CV" in section and "- Not reproduced: α = 10,000" in section


def test_the_real_row_is_the_least_squares_mse_on_the_held_out_folds(section):
    spec_cv = importlib.util.spec_from_file_location(
        "bench_regression_cv", ROOT / "bench" / "regression_cv.py"
    )
    cv = sys.modules.get("bench_regression_cv")
    if cv is None:
        cv = sys.modules["bench_regression_cv"] = importlib.util.module_from_spec(spec_cv)
        spec_cv.loader.exec_module(cv)
    folds = cv.fold_frames("diabetes", cv.Protocol.of(TINY.bench))
    assert [len(t) + len(h) for t, h in folds] == [442, 442]
    mses = sorted(cv.regression_mse(t, h, "target") for t, h in folds)
    median = float(pd.Series(mses).median())
    assert rows(section)["Real training rows"][2].startswith(f"{median:,.0f} [")


def test_validate_skips_regression_tables(tmp_path):
    assert (
        rp.reproduce(
            [TINY],
            seeds=1,
            quick=True,
            validate=True,
            extra=[],
            out=tmp_path,
            command="x",
            log=lambda _: None,
        )
        == {}
    )
