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

Prints, per artefact, the ε lower bound (95%, jointly over artefacts) against the claimed ε.
"""

from __future__ import annotations

import argparse
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
    "ppem": ["model=ppem", "privacy=dp_sgd", "model.sensitive=[mean radius,mean texture]", "model.module.hidden=[32,32]",
             "model.module.latent_dim=16", "model.module.batch_size=32", "model.module.fourier=16",
             "data.batch_size=64", "trainer.max_epochs=1"],
    # GEM: AIM-style rounds (exponential-mechanism selections, Gaussian measurements) between generator fits
    "gem": ["model=gem", "model.module.bins=4", "model.module.batch_size=64", "model.module.steps_per_epoch=30",
            "model.generator.hidden=[16]", "model.mechanisms.0.rounds=40", "model.mechanisms.0.steps_per_round=2",
            "model.mechanisms.0.final_steps=3", "trainer.max_epochs=1"],
}
COMMON = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def schema_path() -> Path:
    return Path(str(resources.files("lightning_dp.data").joinpath("schemas/breast_cancer.yaml")))


def neighbouring_files(folder: Path) -> tuple[Path, Path]:
    """``D.csv`` (breast cancer, 569 rows) and ``D_prime.csv`` (D plus a planted row that the split trains on)."""
    import yaml
    from sklearn.datasets import load_breast_cancer

    bc = load_breast_cancer()
    d = pd.DataFrame(bc.data, columns=list(bc.feature_names))
    d["diagnosis"] = [str(bc.target_names[t]) for t in bc.target]
    schema = yaml.safe_load(schema_path().read_text())
    canary = {c["name"]: c["bounds"][1] for c in schema["columns"] if c["type"] == "continuous"}
    canary["diagnosis"] = "malignant"
    planted = pd.DataFrame([canary])[d.columns]
    folder.mkdir(parents=True, exist_ok=True)
    d_path, p_path = folder / "D.csv", folder / "D_prime.csv"
    d.to_csv(d_path, index=False)
    for _ in range(100):
        pd.concat([d, planted], ignore_index=True).to_csv(p_path, index=False)
        try:  # the keyed-hash split (lightning_dp/data/splits.py): nudge the row until it lands in training
            from lightning_dp.data.sources import read_table
            from lightning_dp.data.splits import holdout_mask
        except ImportError:  # older pipelines: a positional split, the row is appended at the end
            break
        try:  # the split hashes canonical values (lightning_dp/data/canonical.py)
            from lightning_dp.data.canonical import canonical_frame
            from lightning_dp.data.schema import Schema

            rows = canonical_frame(read_table(p_path), Schema.from_yaml(schema_path())).tail(1)
        except ImportError:  # older pipelines hashed the cells as read
            rows = read_table(p_path).tail(1)
        if not holdout_mask(rows, fraction=0.2, seed=0)[0]:
            break
        planted.loc[0, d.columns[0]] = planted.loc[0, d.columns[0]] * (1 - 1e-6)
    return d_path, p_path


def compose_run(data_path: Path, config: str, extra: list[str] = ()) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=[*COMMON, *CONFIGS[config], "data=csv", f"data.path={data_path}",
                                           f"data.schema={schema_path()}", *extra])


def run_once(cfg: DictConfig, source: Path, out: Path) -> dict:
    """One real ``train()`` on a copy of ``source`` at ``cfg.data.path`` (the same path for D and D', so that
    the config is the same), into ``out``; the artefacts it left (the folder is removed afterwards)."""
    from lightning_dp.train import train

    shutil.copyfile(source, cfg.data.path)
    cfg = OmegaConf.merge(cfg, {"output_dir": str(out)})

    def go() -> Path:
        train(cfg)
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
    parser.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides")
    args = parser.parse_args()
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="e2e_privacy_"))
    d_path, p_path = neighbouring_files(work)
    cfg = compose_run(work / "data.csv", args.config, args.set)
    start = time.time()
    if args.deterministic:
        leaks = find_deterministic_leaks(lambda: run_once(cfg, d_path, work / "run"),
                                         lambda: run_once(cfg, p_path, work / "run"))
        print(f"{args.config}: {len(leaks)} values are deterministic functions of the data")
        for leak in leaks[:40]:
            print("  ", leak)
        return
    runs = []
    for i in range(args.runs):
        runs.append(Run(run_once(cfg, p_path, work / "run"), with_canary=True))
        runs.append(Run(run_once(cfg, d_path, work / "run"), with_canary=False))
        if (i + 1) % 25 == 0:
            print(f"  {i + 1} runs per side, {time.time() - start:.0f} s", flush=True)
    claimed = float(cfg.privacy.epsilon)
    bounds = epsilon_lower_bounds(runs, delta=DELTA)
    print(f"\n{args.config}: {args.runs} runs per side on D and D' = D + 1 row; claimed ε = {claimed:g}, δ = {DELTA:g}; "
          f"{time.time() - start:.0f} s")
    print("| artefact | ε lower bound (95%) | FP / FN of n | selection-half bound | top features |")
    print("|---|---|---|---|---|")
    for b in bounds:
        print(f"| {b.artefact} | {b.epsilon_lower_bound:.3f} | {b.false_positives} / {b.false_negatives} of {b.n_per_side} "
              f"| {b.selection_epsilon:.3f} | {', '.join(b.features[:3])} |")
    worst = bounds[0].epsilon_lower_bound if bounds else 0.0
    print(f"max over artefacts: {worst:.3f} ({'below' if worst <= claimed else 'ABOVE'} the claimed ε = {claimed:g})")


if __name__ == "__main__":
    main()
