"""Train a differentially private generator: ``python train.py [key=value ...]`` (Hydra overrides)."""

import logging
import os
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

EXIT_SIGTERM = 143  # 128 + SIGTERM: stopped, checkpoint saved, resume with resume=last
EXIT_SIGINT = 130  # 128 + SIGINT: Ctrl-C, the same
EXIT_USER_ERROR = 2
_TASK_STARTED = False  # Hydra exits 1 both for a bad command line (before main) and for a crash (in main)
_INTERRUPTED = False


def _check_output_dir(argv: list[str]) -> None:
    """Hydra creates ``output_dir`` before ``main`` runs: an unwritable one gets our message, not its traceback."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("output_dir=")]
    if not given:
        return
    folder = Path(given[-1]).expanduser()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)) or _read_only(folder):
        print(f"error: output_dir={given[-1]} cannot be written ({folder} is read-only or not a folder). Choose "
              "another output_dir=PATH; nothing was spent.", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def _read_only(folder: Path) -> bool:
    return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)


def run(cfg: DictConfig, overrides: list[str] | None = None) -> tuple[dict, int]:
    """Train, then (with ``audit=...``) audit the run; the exit code: 0, or the audit's 1 (fail) / 4 (inconclusive).

    Composing the two here keeps ``lightning_dp`` free of ``audits``. The audit's policy is loaded before
    training, so a bad policy is refused before any budget is spent.
    """
    from lightning_dp.train import train

    if cfg.get("audit"):
        from audits.policy import load_policy

        load_policy(cfg.audit.get("policy"))
    result = train(cfg, overrides=overrides)
    code = 0
    if cfg.get("audit") and result.get("synthetic"):
        from audits.report import audit_run

        audit = audit_run(cfg.audit, datamodule=result["datamodule"], result=result, ledger=result["privacy_ledger"],
                          config=result["config"])
        audit = audit if isinstance(audit, dict) else {"report": audit, "status": "pass", "summary": []}
        result["report"], result["audit_status"], result["audit_summary"], result["audit_reason"] = (
            audit["report"], audit["status"], audit.get("summary", []), audit.get("reason", ""))
        code = {"pass": 0, "fail": 1, "inconclusive": 4}[audit["status"]]
    return result, code


def _on_sigint(signum: int, frame: object) -> None:
    """Ctrl-C: remembered (Lightning turns it into ``sys.exit(1)`` inside fit), then the usual KeyboardInterrupt."""
    global _INTERRUPTED
    _INTERRUPTED = True
    raise KeyboardInterrupt


def _stopped(cfg: DictConfig, how: str, code: int) -> None:
    """The truth about an interrupted run, and its exit code (130 Ctrl-C, 143 SIGTERM)."""
    from lightning_dp.errors import python_command

    out = Path(str(cfg.output_dir))
    if not any((out / name).exists() for name in ("ledger.json", ".prefit.json", "checkpoints/last.ckpt")):
        print(f"stopped by {how} before the first release: nothing was spent or saved.", file=sys.stderr)
    elif cfg.get("tune"):
        print(f"stopped by {how}. A tuning run cannot be resumed (its candidates are deleted); {cfg.output_dir}/"
              "ledger.json holds the whole selection's ε, already spent. Start a new run with another output_dir=PATH.",
              file=sys.stderr)
    else:
        print(f"stopped by {how}; the run was saved. Continue it with: {python_command()} train.py "
              f"output_dir={cfg.output_dir} resume=last", file=sys.stderr)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train")
def main(cfg: DictConfig) -> None:
    global _TASK_STARTED
    _TASK_STARTED = True
    from lightning_dp.errors import UserError
    from lightning_dp.quick_checks import check_quick

    try:  # what the config alone shows is refused before torch loads (seconds, not a minute)
        check_quick(cfg)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    # heavy imports after Hydra has parsed the command line (so --help is quick)
    from hydra.core.hydra_config import HydraConfig
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    signal.signal(signal.SIGINT, _on_sigint)
    try:
        result, code = run(cfg, overrides=list(HydraConfig.get().overrides.task))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except SIGTERMException:
        _stopped(cfg, "SIGTERM", EXIT_SIGTERM)
    except KeyboardInterrupt:
        _stopped(cfg, "Ctrl-C", EXIT_SIGINT)
    except SystemExit:
        if _INTERRUPTED:  # Lightning's exit(1) after a Ctrl-C in fit
            _stopped(cfg, "Ctrl-C", EXIT_SIGINT)
        raise
    if result.get("synthetic"):
        print(f"\nPrivacy spent: ε = {result['epsilon']:.4f} (target {cfg.privacy.epsilon}), δ = {result['delta']:g}")
        print(f"  checkpoint : {result['checkpoint']}")
        print(f"  ledger     : {result['ledger']}")
        print(f"  synthetic  : {result['synthetic']}")
    if result.get("report"):
        print(f"  audit      : {result['report']} (private: computed from real rows, not DP)")
        for line in result["audit_summary"]:
            print(f"    {line}")
        print(f"  verdict    : {result['audit_status'].upper()}"
              + (f" ({result['audit_reason']})" if result.get("audit_reason") else ""))
    sys.exit(code)


def cli(argv: list[str]) -> int:
    """``python train.py ARGS``: the exit code (0 done, 1 audit failed or a bug, 2 a user mistake, 4 audit
    inconclusive, 130 stopped by Ctrl-C, 143 stopped by SIGTERM; both save the run for ``resume=last``)."""
    global _TASK_STARTED
    _TASK_STARTED = False
    _check_output_dir(argv)
    logging.getLogger("lightning_dp").setLevel(logging.INFO)
    sys.argv = [sys.argv[0] if sys.argv else "train.py", *argv]
    try:
        main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        return EXIT_USER_ERROR if code == 1 and not _TASK_STARTED else code  # Hydra refused the command line
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
