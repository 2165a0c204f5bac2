"""Train a differentially private generator: ``python train.py [key=value ...]`` (Hydra overrides)."""

import logging
import sys

import hydra
from omegaconf import DictConfig

from lightning_dp.train import train


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    result = train(cfg)
    if result.get("synthetic"):
        print(f"\nPrivacy spent: ε = {result['epsilon']:.4f} (target {cfg.privacy.epsilon}), δ = {result['delta']:g}")
        print(f"  checkpoint : {result['checkpoint']}")
        print(f"  ledger     : {result['ledger']}")
        print(f"  synthetic  : {result['synthetic']}")
        if result.get("report"):
            print(f"  audit      : {result['report']}")


if __name__ == "__main__":
    logging.getLogger("lightning_dp").setLevel(logging.INFO)
    sys.exit(main())
