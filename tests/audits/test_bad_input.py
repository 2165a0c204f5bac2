"""Bad audit input through ``python -m audits`` (``main(argv)`` in-process): a clear error with exit code 2, one
or two lines that name the problem and the fix, no traceback and no partial file in the output folder; or, where
the input is legal but awkward, the specified status (inconclusive: exit 4) or a correct result."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn.datasets import load_breast_cancer

from audits.__main__ import main

FAST = {"checks": {"membership": {"attacks": ["dcr"], "max_auc": 1.0}}}  # one quick check that passes


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Breast cancer as REAL (400 rows), HOLDOUT (169 rows) and a "synthetic" file: REAL's columns shuffled
    independently (its marginals, none of its rows)."""
    folder = tmp_path_factory.mktemp("data")
    bc = load_breast_cancer(as_frame=True).frame.rename(columns={"target": "diagnosis"})
    bc["diagnosis"] = bc["diagnosis"].map({0: "malignant", 1: "benign"})
    real, holdout = bc.iloc[:400].reset_index(drop=True), bc.iloc[400:].reset_index(drop=True)
    rng = np.random.default_rng(0)
    synthetic = pd.DataFrame({c: rng.permutation(real[c].to_numpy()) for c in real.columns})
    paths = {"real": folder / "real.csv", "holdout": folder / "holdout.csv", "synthetic": folder / "syn.csv"}
    for name, frame in (("real", real), ("holdout", holdout), ("synthetic", synthetic)):
        frame.to_csv(paths[name], index=False)
    return paths


def _write_policy(folder: Path, policy: dict | str) -> str:
    path = folder / "policy.yaml"
    path.write_text(policy if isinstance(policy, str) else yaml.safe_dump(policy, allow_unicode=True))
    return str(path)


def _frame(files: dict[str, Path], name: str) -> pd.DataFrame:
    return pd.read_csv(files[name], dtype=str, keep_default_na=False)


def _argv(files: dict[str, Path], out: Path, **change: str) -> list[str]:
    """The CLI's arguments: the module's files, with ``change`` replacing or adding options."""
    args = {
        "synthetic": str(files["synthetic"]),
        "--real": str(files["real"]),
        "--holdout": str(files["holdout"]),
        "--out": str(out),
        **{k if k == "synthetic" else f"--{k.replace('_', '-')}": v for k, v in change.items()},
    }
    return [args.pop("synthetic"), *(x for kv in args.items() for x in kv)]


# ---------------------------------------------------------------------------------- cases of exit code 2
def same_file(files, tmp):
    return {"holdout": str(files["real"]), "policy": _write_policy(tmp, FAST)}


def same_rows(files, tmp):  # another file, the same rows in another order
    _frame(files, "real").iloc[::-1].to_csv(tmp / "copy.csv", index=False)
    return {"holdout": str(tmp / "copy.csv"), "policy": _write_policy(tmp, FAST)}


def unknown_metric(files, tmp):
    return {"policy": _write_policy(tmp, {"checks": {"utility": {"metric": "auroc", "min_score": 0.6}}})}


def unknown_top_level_key(files, tmp):
    return {"policy": _write_policy(tmp, {**FAST, "treshold": 0.5})}


def unknown_check_option(files, tmp):
    return {"policy": _write_policy(tmp, {"checks": {"fidelity": {"max_mean_kss": 0.3}}})}


def attacks_not_a_list(files, tmp):
    return {"policy": _write_policy(tmp, {"checks": {"membership": {"attacks": 5}}})}


def too_few_permutations(files, tmp):
    return {"policy": _write_policy(tmp, {"checks": {"lmdp_mmd": {"n_permutations": 20}}})}


def policy_is_a_folder(files, tmp):
    return {"policy": str(tmp)}


def huge_num_rows(files, tmp):
    return {"num_rows": str(10**9), "policy": _write_policy(tmp, FAST)}


def negative_seed(files, tmp):
    return {"seed": "-1", "policy": _write_policy(tmp, FAST)}


def out_is_a_file(files, tmp):
    (tmp / "out").write_text("not a folder")
    return {"policy": _write_policy(tmp, FAST)}


def out_under_a_file(files, tmp):
    (tmp / "afile").write_text("not a folder")
    return {"out": str(tmp / "afile" / "out"), "policy": _write_policy(tmp, FAST)}


def out_read_only(files, tmp):
    if os.geteuid() != 0:
        folder = tmp / "locked"
        folder.mkdir()
        folder.chmod(0o555)
        return {"out": str(folder / "out"), "policy": _write_policy(tmp, FAST)}
    if not Path("/sys").is_dir():  # root writes through permissions; /sys is read-only even to root
        pytest.skip("no read-only folder for root on this machine")
    return {"out": "/sys/audit-out", "policy": _write_policy(tmp, FAST)}


def real_is_a_folder(files, tmp):
    return {"real": str(tmp), "policy": _write_policy(tmp, FAST)}


def synthetic_is_a_folder(files, tmp):
    return {"synthetic": str(tmp), "policy": _write_policy(tmp, FAST)}


def duplicate_column(files, tmp):
    text = files["real"].read_text().splitlines()
    names = text[0].split(",")
    text[0] = ",".join([*names[:-1], names[0]])  # the last column renamed to the first's name
    (tmp / "dup.csv").write_text("\n".join(text) + "\n")
    return {"real": str(tmp / "dup.csv"), "policy": _write_policy(tmp, FAST)}


def non_number(files, tmp):
    frame = _frame(files, "holdout")
    frame.loc[9, "mean texture"] = "abc"  # row index 9: line 11 of the file (the header is line 1)
    frame.to_csv(tmp / "h.csv", index=False)
    return {"holdout": str(tmp / "h.csv"), "policy": _write_policy(tmp, FAST)}


def infinite_value(files, tmp):
    frame = _frame(files, "synthetic")
    frame.loc[0, "mean area"] = "inf"  # line 2
    frame.to_csv(tmp / "s.csv", index=False)
    return {"synthetic": str(tmp / "s.csv"), "policy": _write_policy(tmp, FAST)}


def label_not_a_column(files, tmp):
    return {"label": "outcome", "policy": _write_policy(tmp, FAST)}


def known_columns_not_columns(files, tmp):
    policy = {"checks": {"attribute_disclosure": {"known_columns": ["age"], "max_risk_above_baseline": 0.1}}}
    return {"policy": _write_policy(tmp, policy)}


def empty_synthetic(files, tmp):
    (tmp / "empty.csv").write_text("")
    return {"synthetic": str(tmp / "empty.csv"), "policy": _write_policy(tmp, FAST)}


def corrupt_checkpoint(files, tmp):
    (tmp / "last.ckpt").write_bytes(os.urandom(256))
    return {"synthetic": str(tmp / "last.ckpt"), "policy": _write_policy(tmp, FAST)}


BAD: list[tuple[Callable, str]] = [
    (
        same_file,
        r"REAL and HOLDOUT are the same file \(.*real\.csv'\)\. HOLDOUT must be real rows never used",
    ),
    (
        same_rows,
        r"REAL and HOLDOUT hold the same 400 rows\. HOLDOUT must be real rows never used in training",
    ),
    (
        unknown_metric,
        r"utility\.metric 'auroc' is unknown; valid metrics: accuracy, f1_macro, f1_weighted, mse",
    ),
    (unknown_top_level_key, r"unknown top-level key\(s\) \['treshold'\]; valid: checks, expectations, seed"),
    (
        unknown_check_option,
        r"check 'fidelity' has unknown option\(s\) \['max_mean_kss'\]; valid: .*max_mean_ks",
    ),
    (attacks_not_a_list, r"membership\.attacks has unknown or unsupported attack\(s\) \[5\].*valid: dcr"),
    (too_few_permutations, r"lmdp_mmd\.n_permutations must be >= 72 for α = 0\.05 at confidence 0\.95"),
    (policy_is_a_folder, r"Policy '.*' is a folder, not a file\. Pass --policy PATH to a YAML policy"),
    (huge_num_rows, r"--num-rows 1,000,000,000 exceeds the audit's limit of 1,000,000 rows"),
    (negative_seed, r"--seed must be in \[0, 4294967295\], got -1"),
    (out_is_a_file, r"--out '.*out' is a file, not a folder\. Pass --out a folder that can be written"),
    (out_under_a_file, r"--out '.*afile/out' cannot be created: '.*afile' is a file, not a folder"),
    (out_read_only, r"--out '.*' cannot be written \(.*\)\. Pass --out a folder that can be written"),
    (real_is_a_folder, r"REAL '.*' is a folder, not a file\. Pass the path of a \.csv or \.parquet file"),
    (synthetic_is_a_folder, r"SYNTHETIC_OR_CHECKPOINT '.*' is a folder, not a file\. Pass a \.csv/\.parquet"),
    (duplicate_column, r"the column name\(s\) \['mean radius'\] appear more than once in the file's header"),
    (
        non_number,
        r"Column 'mean texture' is numeric but HOLDOUT has non-numeric values \['abc'\] \(first on line 11",
    ),
    (infinite_value, r"Column 'mean area' of the synthetic data has an infinite value on line 2 "),
    (
        label_not_a_column,
        r"The label 'outcome' \(--label\) is not a column of REAL; columns: \['mean radius'",
    ),
    (known_columns_not_columns, r"attribute_disclosure\.known_columns \['age'\] are not columns of the data"),
    (empty_synthetic, r"The synthetic data '.*empty\.csv' is empty \(no header, no rows\)"),
    (corrupt_checkpoint, r"Checkpoint '.*last\.ckpt' is corrupt or not a PyTorch checkpoint"),
]


def _no_report_files(out: Path) -> bool:
    """Neither report file nor any temporary file: the folder is absent, empty, or (``--out`` a file) a file."""
    return not out.exists() or out.is_file() or not any(out.iterdir())


@pytest.mark.parametrize("case,message", BAD, ids=[case.__name__ for case, _ in BAD])
def test_bad_input_is_a_clear_error_with_exit_2(files, tmp_path, capsys, case, message):
    change = case(files, tmp_path)
    out = Path(change.pop("out", tmp_path / "out"))
    before = out.read_text() if out.is_file() else None
    code = main(_argv(files, out, **change))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and re.search(message, lines[0]), err
    assert _no_report_files(out)
    assert before is None or out.read_text() == before  # an --out file is left as it was


def test_a_full_disk_while_writing_is_a_clear_error_and_leaves_nothing(files, tmp_path, capsys, monkeypatch):
    import audits.output as output

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output.os, "fsync", full)
    out = tmp_path / "out"
    code = main(_argv(files, out, policy=_write_policy(tmp_path, FAST)))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert re.search(
        r"error: Could not write the report into '.*out': No space left on device\. Free some", err
    )
    assert not out.exists()  # the folder it created is removed again, with every temporary file


def test_a_nearly_full_disk_is_refused_before_any_work(files, tmp_path, capsys, monkeypatch):
    import audits.output as output

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(output.shutil, "disk_usage", lambda p: usage._replace(free=2**20))
    code = main(_argv(files, tmp_path / "out", policy=_write_policy(tmp_path, FAST)))
    err = capsys.readouterr().err
    assert code == 2 and "only 1.0 MiB free on its disk, the report needs up to 32 MiB" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------ legal input, specified status
def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_a_policy_whose_only_check_is_skipped_is_inconclusive_not_a_pass(files, tmp_path, capsys):
    # no --label and files without a schema: utility cannot run, so its threshold is not decided
    policy = _write_policy(tmp_path, {"checks": {"utility": {"min_roc": 0.6}}})
    code = main(_argv(files, tmp_path / "out", policy=policy))
    out = capsys.readouterr().out
    report = _report(tmp_path / "out")
    assert code == 4 and report["status"] == "inconclusive"
    assert [(v["check"], v["status"]) for v in report["verdicts"]] == [("utility", "inconclusive")]
    assert "INCONCLUSIVE utility: did not run: no label" in out and "policy INCONCLUSIVE: " in out


def test_a_tiny_holdout_makes_the_privacy_checks_inconclusive_on_the_page_and_the_console(
    files, tmp_path, capsys
):
    _frame(files, "holdout").iloc[:5].to_csv(tmp_path / "h5.csv", index=False)
    code = main(
        _argv(files, tmp_path / "out", holdout=str(tmp_path / "h5.csv"), policy=_write_policy(tmp_path, FAST))
    )
    out = capsys.readouterr().out
    report = _report(tmp_path / "out")
    reason = "only 2 member and 2 non-member candidates; the privacy checks need at least 25 of each"
    assert code == 4 and report["status"] == "inconclusive" and report["candidates"]["non_members"] == 2
    assert (
        report["checks"]["membership"]["status"] == "skipped"
        and reason in report["checks"]["membership"]["reason"]
    )
    assert report["verdicts"][0]["status"] == "inconclusive" and reason in report["verdicts"][0]["reason"]
    assert f"INCONCLUSIVE membership: did not run: {reason}" in out
    page = (tmp_path / "out" / "report.html").read_text()
    assert reason in page and page.count("INCONCLUSIVE") >= 2  # the policy's badge and the verdict's


def test_one_extreme_cell_does_not_flip_the_lmdp_test(files, tmp_path, capsys):
    # one sensitive column whose synthetic values are 15% too large: the test tells them apart (α-LMDP holds).
    # z-scored with REAL's mean and std, one cell of 1e308 squashed every other value of the column to 0, the
    # test saw no difference (p = 1) and the verdict flipped to FAIL
    synthetic = _frame(files, "synthetic")
    synthetic["mean radius"] = synthetic["mean radius"].astype(float) * 1.15
    synthetic.to_csv(tmp_path / "syn.csv", index=False)
    policy = _write_policy(
        tmp_path, {"checks": {"lmdp_mmd": {"columns": ["mean radius"], "n_permutations": 100}}}
    )
    clean = main(_argv(files, tmp_path / "clean", synthetic=str(tmp_path / "syn.csv"), policy=policy))
    frame = _frame(files, "real")
    frame.loc[5, "mean radius"] = "1e308"  # line 7
    frame.to_csv(tmp_path / "real.csv", index=False)
    extreme = main(
        _argv(
            files,
            tmp_path / "extreme",
            synthetic=str(tmp_path / "syn.csv"),
            real=str(tmp_path / "real.csv"),
            policy=policy,
        )
    )
    out = capsys.readouterr().out
    a, b = _report(tmp_path / "clean")["verdicts"][0], _report(tmp_path / "extreme")["verdicts"][0]
    # α-LMDP is a property, never the verdict: with no leak threshold nothing is decided (exit 4) either way
    assert clean == extreme == 4 and a["status"] == b["status"] == "pass" and not a["gates"]
    assert a["value"] == b["value"] == 1 / 101  # no permutation reached the observed MMD, with or without it
    assert "Column 'mean radius' of REAL has 1 value(s) beyond ±1e+100 (first on line 7), clipped" in out


def test_two_hundred_one_hot_columns_encode_without_overflow(tmp_path, capsys):
    rng = np.random.default_rng(0)

    def frame(n: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "a": rng.integers(0, 100, n).astype(str),
                "b": rng.integers(0, 100, n).astype(str),
                "x": rng.normal(size=n),
            }
        ).rename(columns={"a": "colour", "b": "shape"})

    paths = {name: tmp_path / f"{name}.csv" for name in ("real", "holdout", "synthetic")}
    for name, n in (("real", 400), ("holdout", 200), ("synthetic", 400)):
        frame(n).to_csv(paths[name], index=False)
    code = main(_argv(paths, tmp_path / "out", policy=_write_policy(tmp_path, FAST)))
    report = _report(tmp_path / "out")
    assert code == 0 and report["status"] == "pass"
    assert 0.35 < report["checks"]["membership"]["attacks"]["dcr"]["auc"] < 0.65  # unrelated draws: chance


def test_an_empty_cell_is_a_missing_value_whatever_the_schema_s_tokens():
    """A synthetic CSV writes a missing value as an empty cell; a schema whose token is '?' (cervical) must still
    read it as missing, as the error message promises."""
    from audits.inputs import normalise
    from lightning_dp.data.schema import Schema

    schema = Schema.from_dict({"missing_values": ["?"], "columns": [
        {"name": "a", "type": "continuous", "bounds": [0, 10], "missing": True}]})
    real = pd.DataFrame({"a": ["1", "?", "3"]})
    holdout = pd.DataFrame({"a": [str(v) for v in range(5, 25)]})
    frames, numeric = normalise(pd.DataFrame({"a": ["2", "", "4"]}), real, holdout, schema=schema)
    assert numeric == ["a"] and frames["synthetic"]["a"].isna().tolist() == [False, True, False]
    assert frames["real"]["a"].isna().tolist() == [False, True, False]
