"""Train a differentially private generator: ``python train.py [key=value ...]`` (Hydra overrides)."""

import logging
import sys

import hydra
from omegaconf import DictConfig

EXIT_SIGTERM = 143  # 128 + SIGTERM: stopped, checkpoint saved, resume with resume=last


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    # heavy imports after Hydra has parsed the command line (so --help is quick)
    from hydra.core.hydra_config import HydraConfig
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from lightning_dp.errors import EXIT_USER_ERROR, UserError
    from lightning_dp.train import train

    try:
        result = train(cfg, overrides=list(HydraConfig.get().overrides.task))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except SIGTERMException:
        print(f"stopped by SIGTERM; the run was saved. Continue it with: python train.py output_dir={cfg.output_dir} "
              "resume=last", file=sys.stderr)
        sys.exit(EXIT_SIGTERM)
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
