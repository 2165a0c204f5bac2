"""PEARL utility at (ε, δ) = (1, 1e-5): Adult train-on-synthetic/test-on-real, and MNIST images.

Adult (PEARL Table 2): PEARL trained on the UCI Adult training split (32,561 rows) with and without the
critic, over several seeds; 10 scikit-learn classifiers (``audits.utility.tstr``, preset ``pearl``) are
fitted on the synthetic rows and scored on the UCI test split (16,281 rows). It prints the average over
the 10 classifiers of ROC-AUC and average precision (PRC) from hard predictions (the paper's protocol:
0.721 / 0.618) and from probabilities, as mean ± std over seeds. The paper's test split is balanced by
downsampling (43.6% positives, 537 of 1,231); average precision depends on the positive rate, so the
figures are also given on a test set subsampled (fixed seed) to that rate. A further row samples the
*same* trained generators with balanced labels (post-processing, no privacy cost), which is what the
paper's downsampled training data amounts to.

MNIST (``data=mnist_test``: the MNIST test split, 8,000 images for training, 2,000 held out): PEARL with
the paper's image settings (batch 100, critic every 5 steps, balanced labels), with and without the critic,
and with K = 1,500 frequencies (the paper's Fashion-MNIST value); 10,000 synthetic digits;
``audits.fidelity.image_fidelity`` gives FID/KID against the held-out real digits on the features of a
small CNN trained on the 8,000 real training digits, and the accuracy on the held-out digits of
classifiers trained on the synthetic ones.

    python bench/utility_pearl.py [--seeds 0 1 2] [--adult-steps 8000] [--mnist-steps 6000]
                                  [--skip-adult] [--skip-mnist] [--threads 1] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from threadpoolctl import threadpool_limits

from audits.utility import tstr
from lightning_dp.checkpoint import load_run
from lightning_dp.data.datamodule import PrivateDataModule, decode_samples
from lightning_dp.data.sources import DEFAULT_ROOT
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.train import train

ROOT = Path(__file__).resolve().parents[1]
PAPER = {"roc_auc_hard": 0.721, "prc_hard": 0.618}
PAPER_POSITIVE_RATE = 537 / 1231
METRICS = ("roc_auc_hard", "prc_hard", "roc_auc", "prc")


def config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


def public_data(name: str) -> PrivateDataModule:
    """The data module of ``name`` with its splits (schemas are public: nothing is released here)."""
    dm = PrivateDataModule(name=name, root=str(DEFAULT_ROOT))
    dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=1e-5), generator=mech.noise_generator(0))
    return dm


def resample(checkpoint: str, n: int, labels: torch.Tensor, seed: int) -> pd.DataFrame:
    """Rows of a trained checkpoint with given labels (post-processing), in the user's columns."""
    run = load_run(checkpoint)
    x, y = run.model.sample(n, labels=labels, seed=seed)
    return decode_samples(run.data_state, x, y)


def paper_prevalence(test: pd.DataFrame, label: str, positive: str, seed: int = 0) -> pd.DataFrame:
    """``test`` with negatives subsampled to the paper's positive rate (43.6%)."""
    pos, neg = test[test[label] == positive], test[test[label] != positive]
    keep = int(round(len(pos) * (1 - PAPER_POSITIVE_RATE) / PAPER_POSITIVE_RATE))
    return pd.concat([pos, neg.sample(n=min(keep, len(neg)), random_state=seed)]).reset_index(drop=True)


def fmt(values: list[float]) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def run_adult(args: argparse.Namespace, out: Path) -> None:
    if not (DEFAULT_ROOT / "adult" / "adult.data").exists():
        print(f"Adult: skipped, the data set is not at {DEFAULT_ROOT / 'adult'}.")
        return
    dm = public_data("adult")
    test = dm.holdout
    test_paper = paper_prevalence(test, "income", ">50K")
    n = args.num_samples
    epochs = max(1, args.adult_steps // args.steps_per_epoch)
    print(
        f"\n== Adult: {dm.num_rows:,} training rows (UCI train), test {len(test):,} rows "
        f"({(test['income'] == '>50K').mean():.1%} positive); {n:,} synthetic rows per run; "
        f"{epochs * args.steps_per_epoch:,} generator steps of 1,100 rows; ε = 1, δ = 1e-5; seeds {args.seeds}"
    )
    results: dict[str, dict[str, list[float]]] = {}
    per_model: dict[str, list[pd.DataFrame]] = {}
    for critic in (True, False):
        name = "PEARL" if critic else "PEARL w/o critic"
        for seed in args.seeds:
            cfg = config(
                [
                    "experiment=pearl_adult",
                    f"seed={seed}",
                    f"output_dir={out / f'adult_{critic}_{seed}'}",
                    "trainer.enable_progress_bar=false",
                    f"trainer.max_epochs={epochs}",
                    f"model.module.steps_per_epoch={args.steps_per_epoch}",
                    f"model.module.critic={critic}",
                    f"num_samples={n}",
                    f"data.root={DEFAULT_ROOT}",
                    *args.set,
                ]
            )
            start = time.perf_counter()
            result = train(cfg)
            t_train = time.perf_counter() - start
            synth = pd.read_csv(result["synthetic"])
            balanced = resample(result["checkpoint"], n, torch.arange(n) % 2, seed)
            rows = {
                f"{name}": (synth, test),
                f"{name}, paper's test prevalence": (synth, test_paper),
                f"{name}, balanced synthetic labels": (balanced, test),
            }
            for row, (syn, real) in rows.items():
                res = tstr(syn, real, label="income", classifiers="pearl", seed=seed)
                avg = res.summary["average"]
                for m in METRICS:
                    results.setdefault(row, {}).setdefault(m, []).append(avg[m])
                if row == name:
                    per_model.setdefault(name, []).append(res.table[list(METRICS)])
            print(
                f"  {name}, seed {seed}: trained in {t_train:.0f} s, ε = {result['epsilon']:.4f}, "
                f"ROC/PRC hard {results[name]['roc_auc_hard'][-1]:.3f}/{results[name]['prc_hard'][-1]:.3f}, "
                f"soft {results[name]['roc_auc'][-1]:.3f}/{results[name]['prc'][-1]:.3f}",
                flush=True,
            )
    real = tstr(dm.train_frame, test, label="income", classifiers="pearl", seed=0).summary["average"]
    real_p = tstr(dm.train_frame, test_paper, label="income", classifiers="pearl", seed=0).summary["average"]
    print(
        f"\nAverage over the 10 classifiers, mean ± std over {len(args.seeds)} seeds (paper: ROC 0.721, PRC 0.618 "
        "hard; real-data rows: 0.765 / 0.654)"
    )
    print(f"{'':<48}{'ROC hard':>16}{'PRC hard':>16}{'ROC proba':>16}{'PRC proba':>16}")
    print(f"{'real training data (reference)':<48}" + "".join(f"{real[m]:>16.3f}" for m in METRICS))
    print(
        f"{'real training data, paper test prevalence':<48}" + "".join(f"{real_p[m]:>16.3f}" for m in METRICS)
    )
    for row, vals in results.items():
        print(f"{row:<48}" + "".join(f"{fmt(vals[m]):>16}" for m in METRICS))
    print("\nPer classifier (hard ROC / hard PRC, mean over seeds, UCI test):")
    for name, tables in per_model.items():
        mean = pd.concat(tables).groupby(level=0, sort=False).mean()
        print(
            f"  {name}: "
            + ", ".join(f"{m} {r.roc_auc_hard:.3f}/{r.prc_hard:.3f}" for m, r in mean.iterrows())
        )
        over = mean[["roc_auc_hard", "prc_hard"]]
        print(
            f"    paper-style average ± std over classifiers: ROC {over.roc_auc_hard.mean():.3f} ± "
            f"{over.roc_auc_hard.std(ddof=0):.3f}, PRC {over.prc_hard.mean():.3f} ± {over.prc_hard.std(ddof=0):.3f}"
        )


MNIST_VARIANTS = {  # name: (critic, extra overrides)
    "PEARL (K = 500, the paper's MNIST)": (True, []),
    "PEARL w/o critic (K = 500)": (False, []),
    "PEARL (K = 1,500)": (True, ["model.module.num_features=3000"]),
}


def run_mnist(args: argparse.Namespace, out: Path) -> None:
    from audits.fidelity import image_fidelity

    if not (DEFAULT_ROOT / "mnist-test").exists():
        print(f"MNIST: skipped, the MNIST test split is not at {DEFAULT_ROOT / 'mnist-test'}.")
        return
    dm = public_data("mnist_test")
    train_x = dm.x.numpy().reshape(-1, 28, 28)
    hold_x, hold_y = dm.holdout
    epochs = max(1, args.mnist_steps // args.steps_per_epoch)
    seed = args.seeds[0]
    print(
        f"\n== MNIST test split: {len(train_x):,} training digits, {len(hold_x):,} held out; "
        f"{epochs * args.steps_per_epoch:,} generator steps of 100 (critic every 5); 10,000 synthetic digits with "
        f"balanced labels; ε = 1, δ = 1e-5; seed {seed}",
        flush=True,
    )
    for i, (name, (critic, extra)) in enumerate(MNIST_VARIANTS.items()):
        if name not in args.mnist_variants:
            continue
        cfg = config(
            [
                "model=pearl",
                "data=mnist_test",
                f"seed={seed}",
                f"output_dir={out / f'mnist_{i}'}",
                "trainer.enable_progress_bar=false",
                f"trainer.max_epochs={epochs}",
                f"model.module.steps_per_epoch={args.steps_per_epoch}",
                "model.module.batch_size=100",
                "model.module.n_gen=5",
                "model.module.label_sampling=uniform",
                f"model.module.critic={critic}",
                "num_samples=10000",
                f"data.root={DEFAULT_ROOT}",
                *extra,
                *args.mnist_set,
            ]
        )
        start = time.perf_counter()
        result = train(cfg)
        t_train = time.perf_counter() - start
        with np.load(result["synthetic"]) as z:
            syn_x, syn_y = z["images"], z["labels"]
        start = time.perf_counter()
        fid = image_fidelity(
            train_x,
            hold_x,
            syn_x,
            real_train_labels=dm.y.numpy(),
            synthetic_labels=syn_y,
            real_test_labels=hold_y,
            seed=seed,
        )
        ref = fid["reference"]
        print(
            f"  {name}: trained in {t_train:.0f} s (ε = {result['epsilon']:.4f}), audit {time.perf_counter() - start:.0f} s"
        )
        print(
            f"    FID {fid['fid']:.2f}, KID {fid['kid_mean']:.3f} ± {fid['kid_std']:.3f} "
            f"(real train vs held-out: FID {ref['fid']:.2f}, KID {ref['kid_mean']:.4f})"
        )
        for kind, s in fid["downstream"].items():
            print(
                f"    {kind} trained on the synthetic digits: accuracy {s['accuracy']:.3f} on the held-out real "
                f"digits (trained on the real 8,000: {s['real_accuracy']:.3f})",
                flush=True,
            )
    print(
        f"  features for FID/KID: {fid['feature_extractor']}, {fid['feature_dim']}-d (not the paper's LeNet: "
        "values are not comparable with its Table 1)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--adult-steps", type=int, default=8000, help="generator steps on Adult (paper: 8,000)"
    )
    parser.add_argument(
        "--mnist-steps", type=int, default=6000, help="generator steps on MNIST (paper: 6,000)"
    )
    parser.add_argument("--steps-per-epoch", type=int, default=500)
    parser.add_argument("--num-samples", type=int, default=11000, help="synthetic Adult rows (paper: 11k)")
    parser.add_argument(
        "--mnist-variants", nargs="+", default=list(MNIST_VARIANTS), choices=list(MNIST_VARIANTS)
    )
    parser.add_argument("--skip-adult", action="store_true")
    parser.add_argument("--skip-mnist", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared machine)")
    parser.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides for the Adult runs")
    parser.add_argument(
        "--mnist-set", nargs="*", default=[], help="extra Hydra overrides for every MNIST run"
    )
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)  # BLAS/OpenMP in numpy and scikit-learn too: oversubscription is slow
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        if not args.skip_adult:
            run_adult(args, out)
        if not args.skip_mnist:
            run_mnist(args, out)


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
