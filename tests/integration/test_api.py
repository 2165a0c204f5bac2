"""The Python API (lightning_dp.Synthesizer, audits.api.audit): the README's notebook example end to end, and the
API's own guarantees (same code path and run folder as train.py, checkpoint round trip, refusals)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lightning_dp.data.sources import bundled_schema, load_breast_cancer

ROOT = Path(__file__).resolve().parents[2]


def readme_notebook_example() -> str:
    """The first ```python block of the README's "From Python" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python"):]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, "README's 'From Python' section has no python block"
    return match.group(1)


def test_readme_notebook_example_runs_end_to_end(tmp_path, monkeypatch, single_thread):
    """fit on a DataFrame, sample, audit, save: as written in the README."""
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(readme_notebook_example(), "README.md", "exec"), scope)  # noqa: S102 - our own README
    synth, rows, report = scope["synth"], scope["rows"], scope["report"]
    assert list(rows.columns) == list(scope["real"].columns) and len(rows) == 1000
    assert set(rows["diagnosis"]) <= {"malignant", "benign"}
    assert 0.99 <= synth.ledger.spent <= 1.0  # the whole target, never above it
    assert report.verdict in ("pass", "fail", "inconclusive") and report.verdict == report.to_dict()["status"]
    assert {"membership", "utility", "fidelity"} <= set(report.checks)
    assert report.checks["utility"]["status"] == "ran"  # the label reached the audit
    assert "private" in scope["html"].lower() and "<html" in scope["html"].lower()
    assert report.to_dict()["inputs"]["real"]["path"] == "pandas.DataFrame (in memory)"
    run = tmp_path / "runs" / "notebook"  # the run folder train.py writes
    for name in ("config.yaml", "ledger.json", "versions.json", "train.log", "checkpoints/last.ckpt", "synthetic.csv"):
        assert (run / name).is_file(), name
    assert json.loads((run / "ledger.json").read_text())["epsilon"] == pytest.approx(synth.ledger.spent)
    assert (tmp_path / "runs" / "notebook.ckpt").is_file()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, single_thread):
    from lightning_dp import Synthesizer

    out = tmp_path_factory.mktemp("api") / "run"
    frame = load_breast_cancer().train
    synth = Synthesizer("dp_merf", epsilon=1.0, delta=1e-5, schema=bundled_schema("breast_cancer").to_dict(),
                        output_dir=out, overrides=["model.module.steps_per_epoch=5", "trainer.max_epochs=1"],
                        verbose=False)
    return synth.fit(frame), frame


def test_fit_uses_train_config_and_the_temporary_copy_is_private(fitted):
    synth, frame = fitted
    config = (Path(synth.output_dir) / "config.yaml").read_text()
    assert "holdout_fraction: 0.0" in config and "name: csv" in config
    data_path = Path(re.search(r"path: (.*rows\.parquet)", config).group(1))
    assert data_path.parent.stat().st_mode & 0o077 == 0  # owner-only folder
    assert len(pd.read_parquet(data_path)) == len(frame)  # trained on every row given


def test_sample_is_a_frame_reproducible_by_seed(fitted):
    synth, frame = fitted
    a, b = synth.sample(200, seed=3), synth.sample(200, seed=3)
    assert list(a.columns) == list(frame.columns) and len(a) == 200
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(synth.sample(200, seed=4))


def test_save_load_round_trip_keeps_model_and_ledger(fitted, tmp_path):
    from lightning_dp import Synthesizer

    synth, _ = fitted
    path = synth.save(tmp_path / "copy.ckpt")
    loaded = Synthesizer.load(path)
    assert loaded.model_name == "dp_merf" and loaded.ledger.spent == pytest.approx(synth.ledger.spent)
    assert [r.name for r in loaded.ledger.releases] == [r.name for r in synth.ledger.releases]
    pd.testing.assert_frame_equal(loaded.sample(50, seed=1), synth.sample(50, seed=1))


def test_private_weights_refused_when_the_budget_is_spent(fitted):
    from lightning_dp.privacy.ledger import BudgetExceededError

    synth, _ = fitted
    spent = synth.ledger.spent
    with pytest.raises((BudgetExceededError, ValueError)):
        synth.sample(100, weights="beta_noised", weights_epsilon=0.5)
    assert synth.ledger.spent == spent  # nothing released


def test_audit_of_a_synthesizer_carries_its_ledger(fitted, tmp_path):
    from audits.api import audit

    synth, frame = fitted
    real, holdout = frame.iloc[::2], frame.iloc[1::2]
    report = audit(synth, real, holdout, policy={"checks": {"membership": {"attacks": ["dcr"], "max_auc": 0.9}}},
                   num_rows=200, out=tmp_path / "report")
    assert json.loads((tmp_path / "report" / "report.json").read_text())["status"] == report.verdict
    assert (tmp_path / "report" / "report.html").is_file()
    assert report.to_dict()["ledger"]["epsilon"] == pytest.approx(synth.ledger.spent)
    assert report.verdict in ("pass", "fail", "inconclusive")
    assert [v["check"] for v in report.verdicts] == ["membership"]
    assert str(report).splitlines()[-1].startswith("verdict: ")


def test_bad_input_is_a_user_error_before_anything_runs(tmp_path):
    from lightning_dp import Synthesizer
    from lightning_dp.errors import UserError

    with pytest.raises(UserError, match="not fitted"):
        Synthesizer().sample(10)
    with pytest.raises(UserError, match="model"):
        Synthesizer("no_such_model", output_dir=tmp_path / "x").fit("breast_cancer")
    with pytest.raises(UserError, match="positive whole number"):
        Synthesizer().sample(0)
    assert not (tmp_path / "x").exists()


def test_import_lightning_dp_stays_light():
    code = "import sys, lightning_dp; print(any(m in sys.modules for m in ('torch', 'pytorch_lightning', 'pandas')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
