"""Train a generator on the MNIST test split (8,000 train / 2,000 held out) and score its images.

Prints the accuracy on the 2,000 held-out real digits of classifiers trained on 10,000 synthetic
digits, and FID/KID on features of a small CNN trained on the real training part (no downloads).

    python bench/utility_images.py --model dp_cgan [--epsilon 1] [--epochs 10] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from audits.fidelity import image_fidelity
from lightning_dp.train import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dp_cgan")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="utility_images_"))
    overrides = ["data=mnist_test", f"model={args.model}", f"privacy.epsilon={args.epsilon}", "privacy.delta=1e-5",
                 f"trainer.max_epochs={args.epochs}", "trainer.enable_progress_bar=false", f"output_dir={out}",
                 f"num_samples={args.samples}", *args.overrides]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    result = train(cfg)
    from lightning_dp.data.datamodule import PrivateDataModule

    dm = PrivateDataModule(**cfg.data)
    from lightning_dp.privacy.ledger import PrivacyLedger
    from lightning_dp.privacy.mechanisms import noise_generator

    dm.prepare(PrivacyLedger(target_epsilon=1, delta=1e-5), generator=noise_generator(0))
    train_images = dm.x.numpy().reshape(-1, 28, 28)
    hold_images, hold_labels = dm.holdout
    with np.load(result["synthetic"]) as z:
        synth, synth_labels = z["images"], z["labels"]
    scores = image_fidelity(train_images, hold_images, synth, real_train_labels=dm.y.numpy(),
                            synthetic_labels=synth_labels, real_test_labels=hold_labels, seed=0)
    print(json.dumps({"model": args.model, "epsilon": result["epsilon"], "overrides": args.overrides,
                      "synthetic": result["synthetic"], "scores": scores}, indent=2, default=str))


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
