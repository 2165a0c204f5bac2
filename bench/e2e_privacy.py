"""End-to-end privacy audit of the real ``train()`` on neighbouring files (``audits/end_to_end.py``).

D is the breast-cancer data written as a CSV with its bundled schema; D' is D plus one planted row (every
continuous column at its upper bound, label ``malignant``, chosen so that the keyed-hash split trains on
it). Each run is the shipped config with ``data=csv`` on D or D', training shortened where the steps are
post-processing (DP-MERF's generator steps), and every file of its output folder plus its log records are
read back.

    python bench/e2e_privacy.py --config default --runs 200     # DP-MERF as shipped
    python bench/e2e_privacy.py --config dp_sgd --runs 200      # DP-GAN (DP-SGD on the discriminator)
    python bench/e2e_privacy.py --config weights --runs 200     # DP-GAN plus private importance weights
    python bench/e2e_privacy.py --config default --deterministic   # a few runs: values that are functions of the data
    python bench/e2e_privacy.py --config support_points --format parquet --runs 300   # Parquet, int → float row
    python bench/e2e_privacy.py --config tune --format csv_missing --runs 300          # pandas CSV, "79" → "79.0"

A long audit can run in pieces (a shared machine's job slots are short): each piece saves its runs, and the bound
is computed over all of them (each run draws fresh noise, so pieces are independent runs like any other)::

    python bench/e2e_privacy.py --config tune --format csv_missing --runs 100 --save /tmp/tune_1.pkl   # × 3
    python bench/e2e_privacy.py --config tune --format csv_missing --merge /tmp/tune_*.pkl

File formats (``--format``): ``csv`` (the planted row is a row like any other); ``csv_missing`` (a CSV written by
pandas in which the integer column ``mean area`` holds whole numbers: the planted row leaves it missing, so pandas
writes every other value of the column as ``1001.0`` instead of ``1001``); ``parquet`` (the same column stored as
int64 in D, and as float64 in D' because the planted row holds a fraction). In the last two, adding the row
changes the dtype or text of a column in every other row, which must not move any of them (the split hashes
canonical values).

Files the run labels private (``PRIVATE_FILES``: the tuning's per-candidate table and log, the support points' MCMC
diagnostics) are outside the claim and are not read.

Prints, per artefact, the ε lower bound (95%, jointly over artefacts) against the claimed ε.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import tempfile
import time
from importlib import resources
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from audits.end_to_end import Run, capture_run, epsilon_lower_bounds, find_deterministic_leaks

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5
CONFIGS = {
    # DP-MERF as shipped; its generator steps are post-processing of the one-shot release: 5 of them
    "default": ["trainer.max_epochs=1", "model.module.steps_per_epoch=5"],
    # DP-GAN: every discriminator step is a DP-SGD release, so the whole (short) training is audited
    "dp_sgd": ["model=dp_gan", "data.batch_size=64", "model.module.batch_size=64", "trainer.max_epochs=2"],
    # DP-GAN plus private importance weights (beta_noised on half the budget): the weight column and weights.json too
    "weights": ["model=dp_gan", "data.batch_size=64", "model.module.batch_size=64", "trainer.max_epochs=2",
                "weights=beta_noised", "weights.epsilon=0.5"],
    # PPEM under DP-SGD: the KSD penalty (batch-coupled), the density's public log Z and the dequantised x′
    # private support points (exponential mechanism by MH, DP KDE bandwidth), chains shortened: the release is
    # unconditional, whatever R̂, so short chains change the draw's quality, not what is published
    "support_points": ["model=support_points", "model.module.num_points=10", "model.module.num_steps=20",
                       "model.mechanisms.0.burn_in=500", "model.mechanisms.0.thin=50", "model.mechanisms.0.draws=5",
                       "model.mechanisms.0.num_chains=2", "model.mechanisms.0.trace_every=25", "trainer.max_epochs=2"],
    # private selection (tune=default's TNB selection with E[K] ≈ 1.3 to keep runs short), DP-MERF candidates
    "tune": ["tune=default", "tune.eta=0", "tune.gamma=0.6", "trainer.max_epochs=1", "model.module.steps_per_epoch=5"],
    "ppem": ["model=ppem", "privacy=dp_sgd", "model.sensitive=[mean radius,mean texture]", "model.module.hidden=[32,32]",
             "model.module.latent_dim=16", "model.module.batch_size=32", "model.module.fourier=16",
             "data.batch_size=64", "trainer.max_epochs=1"],
    # GEM: AIM-style rounds (exponential-mechanism selections, Gaussian measurements) between generator fits, after
    # a first block of the 1-way marginals and every (column, label) pair; the label head fitted to them (its tables
    # are in the checkpoint, its loss in train.log)
    "gem": ["model=gem", "model.module.bins=4", "model.module.batch_size=64", "model.module.steps_per_epoch=30",
            "model.module.label_head=true",
            "model.generator.hidden=[16]", "model.mechanisms.0.rounds=40", "model.mechanisms.0.steps_per_round=2",
            "model.mechanisms.0.final_steps=3", "model.mechanisms.0.target_pairs_fraction=0.15",
            "model.mechanisms.0.answer_draws=4096", "trainer.max_epochs=1"],
}
COMMON = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]
FORMATS = ("csv", "csv_missing", "parquet")
INTEGER_COLUMN = "mean area"  # whole numbers in D for csv_missing and parquet (int64 in the Parquet file)
PRIVATE_FILES = ("tuning_private.csv", "tuning_private.log", "support_points_mcmc.json")  # labelled PRIVATE


def schema_path() -> Path:
    return Path(str(resources.files("lightning_dp.data").joinpath("schemas/breast_cancer.yaml")))


def neighbouring_files(folder: Path, file_format: str = "csv") -> tuple[Path, Path]:
    """``D`` (breast cancer, 569 rows) and ``D_prime`` (D plus a planted row that the split trains on), as CSV or
    Parquet (``FORMATS``; module docstring). Returns their paths; the schema is :func:`schema_path` (csv) or a copy
    with ``INTEGER_COLUMN`` allowed missing, beside the files (:func:`run_schema`)."""
    import yaml
    from sklearn.datasets import load_breast_cancer

    if file_format not in FORMATS:
        raise ValueError(f"file format {file_format!r}; valid: {', '.join(FORMATS)}")
    bc = load_breast_cancer()
    d = pd.DataFrame(bc.data, columns=list(bc.feature_names))
    d["diagnosis"] = [str(bc.target_names[t]) for t in bc.target]
    schema = yaml.safe_load(schema_path().read_text())
    canary: dict = {c["name"]: c["bounds"][1] for c in schema["columns"] if c["type"] == "continuous"}
    canary["diagnosis"] = "malignant"
    folder.mkdir(parents=True, exist_ok=True)
    if file_format != "csv":
        d[INTEGER_COLUMN] = d[INTEGER_COLUMN].round().astype("int64")
        # csv_missing: the row leaves the whole-number column empty; parquet: it holds a fraction there
        canary[INTEGER_COLUMN] = float("nan") if file_format == "csv_missing" else 1000.5
        for col in schema["columns"]:
            if col["name"] == INTEGER_COLUMN:
                col["missing"] = True
        (folder / "schema.yaml").write_text(yaml.safe_dump(schema))
    planted = pd.DataFrame([canary])[d.columns]
    suffix = ".parquet" if file_format == "parquet" else ".csv"
    d_path, p_path = folder / f"D{suffix}", folder / f"D_prime{suffix}"
    write = (lambda f, p: f.to_parquet(p, index=False)) if suffix == ".parquet" else (lambda f, p: f.to_csv(p, index=False))
    write(d, d_path)
    from lightning_dp.data.canonical import canonical_frame
    from lightning_dp.data.schema import Schema
    from lightning_dp.data.sources import read_table
    from lightning_dp.data.splits import holdout_mask

    for _ in range(100):
        write(pd.concat([d, planted], ignore_index=True), p_path)
        # the keyed-hash split of canonical values (lightning_dp/data/splits.py): nudge the row until it trains
        rows = canonical_frame(read_table(p_path), Schema.from_yaml(run_schema(folder, file_format))).tail(1)
        if not holdout_mask(rows, fraction=0.2, seed=0)[0]:
            break
        planted.loc[0, d.columns[0]] = planted.loc[0, d.columns[0]] * (1 - 1e-6)
    return d_path, p_path


def run_schema(folder: Path, file_format: str = "csv") -> Path:
    """The schema of :func:`neighbouring_files`'s files: the bundled one, or its copy for an integer column."""
    return schema_path() if file_format == "csv" else folder / "schema.yaml"


def compose_run(data_path: Path, config: str, extra: list[str] = (), schema: Path | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=[*COMMON, *CONFIGS[config], "data=csv", f"data.path={data_path}",
                                           f"data.schema={schema or schema_path()}", *extra])


def run_once(cfg: DictConfig, source: Path, out: Path) -> dict:
    """One real ``train()`` on a copy of ``source`` at ``cfg.data.path`` (the same path for D and D', so that
    the config is the same), into ``out``; the artefacts it left (the folder is removed afterwards)."""
    from lightning_dp.train import train

    shutil.copyfile(source, cfg.data.path)
    cfg = OmegaConf.merge(cfg, {"output_dir": str(out)})

    def go() -> Path:
        train(cfg)
        for name in PRIVATE_FILES:  # labelled private by the run: outside the claim, not published
            (out / name).unlink(missing_ok=True)
        return out

    try:
        return capture_run(go)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="default")
    parser.add_argument("--runs", type=int, default=200, help="runs per side (D and D')")
    parser.add_argument("--deterministic", action="store_true", help="only the deterministic-value check (2 to 8 runs per side)")
    parser.add_argument("--format", choices=FORMATS, default="csv", help="how D and D' are written (docstring)")
    parser.add_argument("--report-every", type=int, default=0,
                        help="also print the worst bound every N runs per side (a long run's partial figures)")
    parser.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides")
    parser.add_argument("--save", type=Path, help="write this piece's runs to FILE (every 25 runs per side)")
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="no runs: the bound over the runs these --save files hold (this bench's own files)")
    args = parser.parse_args()
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="e2e_privacy_"))
    d_path, p_path = neighbouring_files(work, args.format)
    cfg = compose_run(work / f"data{d_path.suffix}", args.config, args.set, run_schema(work, args.format))
    start = time.time()
    if args.deterministic:
        leaks = find_deterministic_leaks(lambda: run_once(cfg, d_path, work / "run"),
                                         lambda: run_once(cfg, p_path, work / "run"))
        print(f"{args.config} ({args.format}): {len(leaks)} values are deterministic functions of the data")
        for leak in leaks[:40]:
            print("  ", leak)
        return
    if args.merge:
        runs = [run for path in args.merge for run in pickle.loads(path.read_bytes())]  # files this bench wrote
        report(runs, args, cfg, len(runs) // 2, f"{len(args.merge)} pieces merged")
        return
    runs = []
    for i in range(args.runs):
        runs.append(Run(run_once(cfg, p_path, work / "run"), with_canary=True))
        runs.append(Run(run_once(cfg, d_path, work / "run"), with_canary=False))
        if (i + 1) % 25 == 0:
            print(f"  {i + 1} runs per side, {time.time() - start:.0f} s", flush=True)
            if args.save:
                save(runs, args.save)
        if args.report_every and (i + 1) % args.report_every == 0 and i + 1 < args.runs:
            worst = epsilon_lower_bounds(runs, delta=DELTA)[0]
            print(f"  partial, {i + 1} runs per side: max ε lower bound {worst.epsilon_lower_bound:.3f} "
                  f"({worst.artefact})", flush=True)
    if args.save:
        save(runs, args.save)
    report(runs, args, cfg, args.runs, f"{time.time() - start:.0f} s")


def save(runs: list[Run], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(pickle.dumps(runs))
    os.replace(tmp, path)


def report(runs: list[Run], args: argparse.Namespace, cfg: DictConfig, per_side: int, how: str) -> None:
    claimed = float(cfg.privacy.epsilon)
    bounds = epsilon_lower_bounds(runs, delta=DELTA)
    print(f"\n{args.config} ({args.format}): {per_side} runs per side on D and D' = D + 1 row; claimed ε = {claimed:g}, "
          f"δ = {DELTA:g}; {how}")
    print("| artefact | ε lower bound (95%) | FP / FN of n | selection-half bound | top features |")
    print("|---|---|---|---|---|")
    for b in bounds:
        print(f"| {b.artefact} | {b.epsilon_lower_bound:.3f} | {b.false_positives} / {b.false_negatives} of {b.n_per_side} "
              f"| {b.selection_epsilon:.3f} | {', '.join(b.features[:3])} |")
    worst = bounds[0].epsilon_lower_bound if bounds else 0.0
    print(f"max over artefacts: {worst:.3f} ({'below' if worst <= claimed else 'ABOVE'} the claimed ε = {claimed:g})")


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
