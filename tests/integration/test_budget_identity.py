"""What the budget registry knows from the rows stays in the registry: a run's streams and files name its data set by
the owner's ``privacy.dataset_name`` only, and read the same whether the rows are new to the registry or known.

Runs share one registry: D, D again, D plus one row, half of D. The fingerprints (keyed functions of the rows) would
tell D from D plus one row in any log or file that showed them. The changed files are charged to D's budget (the
registry's sketches see that they are mostly D's rows), and the runs' streams do not say so either.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sqlalchemy import select

from lightning_dp.budget import tables as t
from lightning_dp.budget.registry import Registry
from lightning_dp.train import train
from tests.conftest import make_cfg

SCHEMA = {"columns": [{"name": "x", "type": "continuous", "bounds": [0.0, 1.0]},
                      {"name": "c", "type": "categorical", "categories": ["a", "b"]}]}
N = 300


def write_rows(tmp_path: Path, name: str, index: np.ndarray) -> Path:
    """Rows ``index`` of one fixed table of 2N rows, as a CSV, and its schema beside it."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.uniform(size=2 * N).round(6), "c": rng.choice(["a", "b"], 2 * N)})
    path = tmp_path / f"{name}.csv"
    frame.iloc[index].to_csv(path, index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    return path


def cfg_for(tmp_path: Path, rows: Path, out: str, *extra: str):
    return make_cfg(tmp_path / out, "data=csv", f"data.path={rows}", f"data.schema={tmp_path / 'schema.yaml'}",
                    "privacy.allow_large_delta=true", *extra)


@pytest.fixture()
def registry(tmp_path, monkeypatch) -> Registry:
    path = tmp_path / "budget.sqlite"
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY", str(path))
    reg = Registry(str(path))
    yield reg
    reg.close()


def _artefacts(out: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(out.rglob("*"))
                     if p.is_file() and p.suffix in (".log", ".json", ".yaml", ".csv") and p.name != "synthetic.csv")


def test_streams_and_files_name_no_row_derived_identifier(registry, tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO)
    d = write_rows(tmp_path, "d", np.arange(N))
    d1 = write_rows(tmp_path, "d1", np.arange(N + 1))
    half = write_rows(tmp_path, "half", np.arange(N // 2))
    seen: dict[str, tuple[list[str], str]] = {}
    for out, rows in (("new", d), ("known", d), ("plus_one", d1), ("half", half)):
        caplog.clear()
        result = train(cfg_for(tmp_path, rows, out))
        ckpt = Path(result["checkpoint"]).read_bytes()
        streams = [r.getMessage() for r in caplog.records] + capsys.readouterr().err.splitlines()
        seen[out] = (streams, _artefacts(tmp_path / out) + ckpt.decode("latin-1"))
    with registry.engine.connect() as conn:
        fingerprints = [r.fingerprint for r in conn.execute(select(t.fingerprints))]
        names = [r.name for r in conn.execute(select(t.datasets))]
    assert len(fingerprints) == 3 and len(names) == 1 and names[0].startswith("fp-")  # one data set, one budget
    (ds,) = registry.datasets()
    assert len(registry.runs(ds)) == 4
    for streams, files in seen.values():
        text = "\n".join(streams) + files
        assert "fp-" not in text and not any(fp[:12] in text for fp in fingerprints)
        assert "new to the budget registry" not in text

    def registry_lines(streams: list[str]) -> list[str]:  # the run's id is random: it tells nothing
        return [re.sub(r"\b[0-9a-f]{32}\b", "RUN", s) for s in streams if "registry" in s]

    lines = {out: registry_lines(streams) for out, (streams, _) in seen.items()}
    assert lines["new"] and lines["new"] == lines["known"] == lines["plus_one"] == lines["half"]
    assert "unnamed data set" in lines["new"][0]


def test_a_named_data_set_is_named_by_its_public_name(registry, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    train(cfg_for(tmp_path, write_rows(tmp_path, "d", np.arange(N)), "run", "privacy.dataset_name=clinic"))
    assert any("'clinic'" in r.getMessage() and "registry" in r.getMessage() for r in caplog.records)
