"""The resume and sampling paths refuse tampered or impossible input through the real entry points: exit 2, one
``error:`` line, no traceback, nothing released (the registry's record and the run's files unchanged) and nothing
half-written."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_dp.budget.registry import Registry
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

spec = importlib.util.spec_from_file_location("train_entry_budget", ROOT / "train.py")
entry = sys.modules["train_entry_budget"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)

GAN = ["model=dp_gan", "model.module.batch_size=64", "data.batch_size=64", "trainer.max_epochs=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("budget_faults") / "run"
    train(make_cfg(out, *GAN))
    return out


def _edit_yaml(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


def _edit_ckpt(path: Path, change) -> None:
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


def _mechanism(config: dict) -> dict:
    return next(m for m in config["model"]["mechanisms"] if "max_grad_norm" in m)


def _first_weight(ckpt: dict) -> None:
    key = next(iter(ckpt["state_dict"]))
    ckpt["state_dict"][key] = torch.zeros(*ckpt["state_dict"][key].shape, 3)


CASES = {
    "another model's weights": (lambda o: _edit_ckpt(o / "checkpoints/last.ckpt", _first_weight), [],
                                "not model=dp_gan's as configured"),
    "changed clip norm": (lambda o: _edit_yaml(o / "config.yaml", lambda c: _mechanism(c).update(max_grad_norm=5.0)),
                          [], "disagree on model.mechanisms"),
    "forged target": (lambda o: _edit_ckpt(o / "checkpoints/last.ckpt", lambda c: c["lightning_dp"]["ledger"].update(
        target_epsilon=5.0)), [], "integrity tag|do not describe the same run"),
    "lr .nan": (lambda o: (o / "config.yaml").write_text((o / "config.yaml").read_text().replace(
        "lr_g: ", "lr_g: .nan #", 1)), [], "is not a finite number"),
    "config edited to ε=5": (lambda o: _edit_yaml(o / "config.yaml", lambda c: c["privacy"].update(epsilon=5.0)), [],
                             "disagree on privacy.epsilon"),
    "!!python/ tag": (lambda o: (o / "config.yaml").write_text("seed: !!python/object/apply:os.getcwd []\n"
                                                               + (o / "config.yaml").read_text()), [],
                      "not plain YAML"),
    "max_epochs below the epochs done": (lambda o: None, ["trainer.max_epochs=1"], "below the 2 epochs the run has done"),
    "interpolation in config.yaml": (lambda o: _edit_yaml(o / "config.yaml", lambda c: c["data"].update(
        root="${oc.env:HOME}")), [], r"data.root = '\$\{oc.env:HOME\}' is an interpolation"),
    "interpolation in the checkpoint": (lambda o: (_edit_ckpt(o / "checkpoints/last.ckpt", lambda c: c["lightning_dp"][
        "config"]["data"].update(root="${oc.env:HOME}")), (o / "config.yaml").unlink()), [], "is an interpolation"),
    "ledger.json edited": (lambda o: _edit_ledger_json(o), [], "integrity tag"),
}


def _edit_ledger_json(out: Path) -> None:
    import json

    d = json.loads((out / "ledger.json").read_text())
    d["releases"] = d["releases"][:1]
    (out / "ledger.json").write_text(json.dumps(d))


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_or_impossible_resume_exits_2_and_releases_nothing(case, run, tmp_path, capsys, budget_registry):
    from hydra.core.global_hydra import GlobalHydra

    tamper, extra, match = CASES[case]
    out = tmp_path / "run"
    shutil.copytree(run, out)
    tamper(out)
    before = _files(out)
    reg = Registry(str(budget_registry))
    (row,) = [r for ds in reg.datasets() for r in reg.runs(ds) if r.output_dir == str(run)]
    GlobalHydra.instance().clear()
    code = entry.cli([f"output_dir={out}", "resume=last", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(match, err), err
    assert _files(out) == before  # nothing written, nothing half-written
    after = reg.run(row.run_id)
    assert (after.seq, after.state, after.active) == (row.seq, row.state, False)  # nothing released


def test_a_checkpoint_with_huge_networks_is_refused_before_allocating(run, tmp_path, capsys):
    from lightning_dp.sample import main

    ckpt = tmp_path / "huge.ckpt"
    shutil.copy(run / "checkpoints" / "last.ckpt", ckpt)
    _edit_ckpt(ckpt, lambda c: c["lightning_dp"]["config"]["model"]["generator"].update(hidden=[10**9, 10**9]))
    assert main([str(ckpt), "--num-rows", "10", "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: .*networks .*needs about .* of memory", err), err
    assert not (tmp_path / "x.csv").exists()


def test_sampling_streams_in_chunks(run, tmp_path, monkeypatch):
    import numpy as np
    import pandas as pd

    import lightning_dp.synthetic as synthetic
    from lightning_dp.sample import sample_checkpoint

    monkeypatch.setattr(synthetic, "CHUNK_BYTES", 2**16)  # chunks of a few dozen rows
    sizes = []
    real = synthetic.decode_samples
    monkeypatch.setattr(synthetic, "decode_samples", lambda s, x, y: (sizes.append(len(x)), real(s, x, y))[1])
    path = sample_checkpoint(run / "checkpoints" / "last.ckpt", 2500, tmp_path / "rows.csv", seed=0)
    rows = pd.read_csv(path)
    assert len(rows) == 2500 and max(sizes) < 500 and len(sizes) > 5 and sum(sizes) == 2500
    whole = sample_checkpoint(run / "checkpoints" / "last.ckpt", 2500, tmp_path / "rows.parquet", seed=0)
    assert len(pd.read_parquet(whole)) == 2500
    assert np.isfinite(rows.select_dtypes("number").to_numpy()).all()
