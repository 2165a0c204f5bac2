"""Bad input through the real ``python train.py`` entry point (in-process): exit code 2, a one- or two-line
message that names the problem, no traceback, and no file in the output folder (nothing was spent)."""

import importlib.util
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_data import toy_frame, toy_schema

spec = importlib.util.spec_from_file_location("train_entry", ROOT / "train.py")
entry = sys.modules["train_entry"] = importlib.util.module_from_spec(spec)  # the script, not lightning_dp.train
spec.loader.exec_module(entry)

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    good = toy_frame(n=400)
    good.to_csv(d / "rows.csv", index=False)
    (d / "schema.yaml").write_text(yaml.safe_dump(toy_schema().to_dict()))
    variants = {
        "bad_cell": lambda f: f.assign(age=f["age"].where(f.index != 5, "forty")),
        "unknown_category": lambda f: f.assign(city=f["city"].where(f.index != 9, "zzz")),
        "empty_cell": lambda f: f.assign(label=f["label"].where(f.index != 3, "")),
        "infinite": lambda f: f.assign(income=f["income"].where(f.index != 4, "inf")),
        "out_of_bounds": lambda f: f.assign(age=f["age"].where(f.index != 6, "150")),
        "huge": lambda f: f.assign(income=f["income"].where(f.index != 7, "1e308")),
        "extra_column": lambda f: f.assign(extra="x"),
        "missing_column": lambda f: f.drop(columns=["city"]),
    }
    for name, change in variants.items():
        change(good.copy()).to_csv(d / f"{name}.csv", index=False)
    (d / "dup.csv").write_text("age,age,income,city,label\n30,31,5,a,no\n")
    (d / "empty.csv").write_text("")
    (d / "ragged.csv").write_text("age,income,city,label\n30,5,a,no\n31,6,b,yes,extra,more\n")
    (d / "list_schema.yaml").write_text("- age\n- income\n")
    (d / "scalar_schema.yaml").write_text("42\n")
    (d / "broken_schema.yaml").write_text("columns: [ {name: age\n")
    (d / "inf_bounds.yaml").write_text(yaml.safe_dump({**toy_schema().to_dict(), "columns": [
        {"name": "age", "type": "continuous", "bounds": [17, float("inf")]},
        *toy_schema().to_dict()["columns"][1:]]}))
    (d / "bad_type.yaml").write_text(yaml.safe_dump({**toy_schema().to_dict(), "columns": [
        {"name": "age", "type": "number"}, *toy_schema().to_dict()["columns"][1:]]}))
    (d / "a_file").write_text("not a folder")
    return d


def _csv(d, name="rows.csv", schema="schema.yaml"):
    return ["data=csv", f"data.path={d / name}", f"data.schema={d / schema}"]


CASES = {
    # settings
    "epsilon zero": (lambda d: ["privacy.epsilon=0"], "privacy.epsilon must be"),
    "epsilon negative": (lambda d: ["privacy.epsilon=-1"], "privacy.epsilon must be"),
    "epsilon huge": (lambda d: ["privacy.epsilon=1e9"], "privacy.epsilon must be"),
    "epsilon a boolean": (lambda d: ["privacy.epsilon=true"], "privacy.epsilon must be a number"),
    "epsilon a word": (lambda d: ["privacy.epsilon=abc"], "privacy.epsilon must be a number"),
    "delta one": (lambda d: ["privacy.delta=1"], "privacy.delta must be"),
    "delta a word": (lambda d: ["privacy.delta=abc"], "privacy.delta must be a number"),
    "delta above 1/n": (lambda d: ["privacy.delta=0.01"], "not below 1/n"),
    "misspelt privacy key": (lambda d: ["+privacy.epsilom=5"], "epsilom (did you mean epsilon?)"),
    "misspelt data key": (lambda d: ["+data.max_row=5"], "max_row (did you mean max_rows?)"),
    "unknown accountant": (lambda d: ["privacy.accountant=gdp"], "privacy.accountant='gdp' is unknown"),
    "unknown adjacency": (lambda d: ["privacy.adjacency=swap"], "privacy.adjacency='swap' is unknown"),
    "dp-sgd with replace-one": (lambda d: ["model=dp_gan", "privacy.adjacency=replace_one"], "add/remove"),
    "count share too large": (lambda d: ["privacy.count_budget_fraction=0.9"], "count_budget_fraction"),
    "negative num_samples": (lambda d: ["num_samples=-5"], "num_samples must be"),
    "fractional num_samples": (lambda d: ["num_samples=2.5"], "num_samples must be a whole number"),
    "zero batch size": (lambda d: ["data.batch_size=0"], "data.batch_size must be"),
    "zero max_rows": (lambda d: ["data.max_rows=0"], "data.max_rows must be"),
    "holdout fraction above 1": (lambda d: ["data.holdout_fraction=1.5"], "data.holdout_fraction must be"),
    "zero epochs": (lambda d: ["trainer.max_epochs=0"], "trainer.max_epochs must be"),
    "seed a word": (lambda d: ["seed=abc"], "seed must be a whole number"),
    "seed fractional": (lambda d: ["seed=1.5"], "seed must be a whole number"),
    "noise seed a word": (lambda d: ["privacy.noise_seed=abc"], "privacy.noise_seed must be a whole number"),
    "sensitive a string": (lambda d: ["model=ppem", "model.sensitive=age"], r"model.sensitive=\[age\]"),
    "unknown model": (lambda d: ["model.name=gan9000"], "Unknown model 'gan9000'"),
    "unknown data set": (lambda d: ["data.name=nope"], "Unknown data set 'nope'"),
    "unknown model group": (lambda d: ["model=gan9000"], "model/gan9000"),
    "bad override syntax": (lambda d: ["privacy.epsilon=="], ""),
    "audit on images": (lambda d: ["data=digits", "audit=default"], "reports on tabular data"),
    "unknown network class": (lambda d: ["model.generator._target_=builtins.open"], "not a registered"),
    # files and folders
    "output_dir is a file": (lambda d: [f"output_dir={d / 'a_file'}"], "cannot be written"),
    "csv without schema": (lambda d: ["data=csv", f"data.path={d / 'rows.csv'}"], "needs data.schema=PATH"),
    "csv without path": (lambda d: ["data=csv"], "needs data.path=PATH"),
    "data path missing": (lambda d: _csv(d, "nope.csv"), "does not exist"),
    "data path is a folder": (lambda d: ["data=csv", f"data.path={d}", f"data.schema={d / 'schema.yaml'}"],
                              "is a folder"),
    "schema is a folder": (lambda d: _csv(d, schema=""), "is a folder"),
    "schema missing": (lambda d: _csv(d, schema="nope.yaml"), "does not exist"),
    "schema is a list": (lambda d: _csv(d, schema="list_schema.yaml"), "must be a mapping"),
    "schema is a scalar": (lambda d: _csv(d, schema="scalar_schema.yaml"), "must be a mapping"),
    "schema is broken yaml": (lambda d: _csv(d, schema="broken_schema.yaml"), "broken_schema.yaml' is not valid YAML"),
    "schema bounds infinite": (lambda d: _csv(d, schema="inf_bounds.yaml"), "bounds must be finite"),
    "schema unknown type": (lambda d: _csv(d, schema="bad_type.yaml"), "unknown type 'number'"),
    "duplicate column": (lambda d: _csv(d, "dup.csv"), "names these columns more than once: ['age']"),
    "empty file": (lambda d: _csv(d, "empty.csv"), "Could not parse"),
    "ragged csv": (lambda d: _csv(d, "ragged.csv"), "Could not parse"),
    "extra column": (lambda d: _csv(d, "extra_column.csv"), "not in the schema: ['extra']"),
    "missing column": (lambda d: _csv(d, "missing_column.csv"), "missing from the file: ['city']"),
    # cells
    "non-numeric cell": (lambda d: _csv(d, "bad_cell.csv"), "'forty'.*on lines 7"),
    "category not in the public list": (lambda d: _csv(d, "unknown_category.csv"), "'zzz'.*on lines 11"),
    "empty cell without missing": (lambda d: _csv(d, "empty_cell.csv"), "'label' has empty cells.*lines 5"),
    "infinite cell": (lambda d: _csv(d, "infinite.csv"), "infinite values.*lines 6"),
    "cell above public bound": (lambda d: _csv(d, "out_of_bounds.csv"), "outside its public bounds.*lines 8"),
    "1e308 cell": (lambda d: _csv(d, "huge.csv"), "outside its public bounds.*lines 9"),
    # resume
    "resume with nothing there": (lambda d: ["resume=last"], "config"),
    "resume a missing checkpoint": (lambda d: [f"resume={d / 'nope.ckpt'}"], "does not exist"),
    "resume a corrupt checkpoint": (lambda d: [f"resume={d / 'a_file'}"], "corrupt"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_a_message_and_no_file(case, files, tmp_path, capsys):
    from hydra.core.global_hydra import GlobalHydra

    make, match = CASES[case]
    argv = make(files)
    out = tmp_path / "run"
    if not any(a.startswith("output_dir=") for a in argv):
        argv = [f"output_dir={out}", *argv]
    GlobalHydra.instance().clear()
    try:
        code = entry.cli(argv)
    except SystemExit as stop:  # the output-folder check before Hydra
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    import re

    assert match in err or re.search(match, err), err
    written = sorted(p.name for p in out.rglob("*") if p.is_file()) if out.exists() else []
    if case == "delta above 1/n":  # n is private: the check needs the DP count, which is spent and recorded
        assert written == [".prefit.json", "config.yaml", "ledger.json", "train.log", "versions.json"]
    else:
        assert written == []
