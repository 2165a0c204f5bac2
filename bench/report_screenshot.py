"""Train DP-MERF on UCI Adult, audit the checkpoint with ``python -m audits``, and screenshot ``report.html``.

A visual check of the report page on real data: trains ``experiment=dp_merf_adult`` (with fewer steps,
``--epochs`` × ``--steps``), runs the audit from the checkpoint with REAL and HOLDOUT given as the data set
name ``adult`` (the run's split, reloaded with its released schema), and opens the page in headless
Chromium (``apt-get install -y chromium``), saving a PNG. Skips cleanly (exit 0) when ``../shared/data/adult``
or Chromium is absent.

    python bench/report_screenshot.py [--out outputs/report_screenshot] [--epochs 1] [--steps 100]
    python bench/report_screenshot.py --checkpoint outputs/report_screenshot/run/checkpoints/last.ckpt

Prints the audit's verdict lines, the report's path and the screenshot's path (``OUT/report.png``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared" / "data" / "adult"


def screenshot(html: Path, png: Path, *, width: int = 1400, height: int = 6000) -> None:
    """Headless Chromium screenshot of a local page (no network, throwaway profile)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            f"--window-size={width},{height}",
            html.resolve().as_uri(),
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=180)


def train_adult(run_dir: Path, *, epochs: int, steps: int) -> str:
    """A fresh ``experiment=dp_merf_adult`` run with ``epochs`` × ``steps`` generator steps; its checkpoint."""
    from lightning_dp.train import train

    if run_dir.exists():
        shutil.rmtree(run_dir)  # a run directory that spent budget refuses a second training
    overrides = [
        "experiment=dp_merf_adult",
        f"trainer.max_epochs={epochs}",
        f"model.module.steps_per_epoch={steps}",
        "trainer.enable_progress_bar=false",
        f"output_dir={run_dir}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    start = time.perf_counter()
    result = train(cfg)
    print(f"trained DP-MERF on Adult: ε = {result['epsilon']:.4f} in {time.perf_counter() - start:.0f} s")
    return result["checkpoint"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "outputs" / "report_screenshot"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100, help="generator steps per epoch")
    parser.add_argument(
        "--checkpoint", default=None, help="audit this Adult run's checkpoint instead of training"
    )
    args = parser.parse_args()
    if not ADULT.exists():
        print(f"skipped: the Adult data set is not at {ADULT}")
        return 0
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        print("skipped: no chromium on PATH (apt-get install -y chromium)")
        return 0
    from audits.report import run_audit

    out = Path(args.out)
    checkpoint = args.checkpoint or train_adult(out / "run", epochs=args.epochs, steps=args.steps)
    start = time.perf_counter()
    report, paths = run_audit(checkpoint, real="adult", holdout="adult", out=out)
    print(f"audited in {time.perf_counter() - start:.0f} s")
    for v in report["verdicts"]:
        value = "n/a" if v["value"] is None else f"{v['value']:.4g}"
        print(
            f"  {v['status'].upper()}  {v['check']}: {v['description']} = {value} {v['op']} {v['limit']:g}"
        )
    png = out / "report.png"
    screenshot(Path(paths["html"]), png)
    print(f"report: {paths['html']}\nscreenshot: {png}")
    return 0


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    sys.exit(main())
