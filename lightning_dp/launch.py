"""Several processes, one set of releases: rank 0 releases before training, the others read its result.

Before ``Trainer.fit`` there is no process group, yet the data module already releases the DP row
count and any DP schema facts. Were every rank to release them, the ranks would hold different noisy
values (different q, different encoders) and the run would spend the budget once per rank. So only
the launching process (global rank 0) releases; it writes the ledger and the public data state to
``<output_dir>/.prefit.json`` (atomically) under a run id that the other ranks share, and they wait
for that file and load it instead of releasing.

The run id comes from ``LIGHTNING_DP_RUN_ID`` when set; rank 0 sets it otherwise, and the ranks that
Lightning spawns inherit its environment. Ranks started elsewhere (torchrun, SLURM on several nodes)
use ``SLURM_JOB_ID`` or torchrun's ``--rdzv-id``, or need ``LIGHTNING_DP_RUN_ID`` exported to one value.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from lightning_dp.privacy.durable import Payload

HANDOFF = ".prefit.json"
RUN_ID = "LIGHTNING_DP_RUN_ID"


def launch_rank() -> int:
    """This process's global rank as the launcher set it (0 for a single process)."""
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key) is not None:
            return int(os.environ[key])
    local = int(os.environ.get("LOCAL_RANK", 0))
    return local if int(os.environ.get("NODE_RANK", 0)) == 0 else local + 1  # any rank off node 0 is > 0


def _run_id(*, create: bool) -> str | None:
    if os.environ.get(RUN_ID):
        return os.environ[RUN_ID]
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}-{os.environ.get('SLURM_STEP_ID', '')}"
    if os.environ.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    if create:
        os.environ[RUN_ID] = secrets.token_hex(8)  # inherited by the ranks Lightning spawns
        return os.environ[RUN_ID]
    return None


def publish_prefit(output_dir: str | Path, *, ledger: dict[str, Any], data: dict[str, Any],
                   complete: bool) -> None:
    """Rank 0: save the pre-fit ledger and data state (DP or public values only), atomically.

    The same file is the durable record of the pre-training releases (a resumed run reuses its count and
    schema instead of releasing them again) and, once ``complete``, the hand-off to the other ranks.
    """
    prefit_payload(output_dir, ledger=ledger, data=data, complete=complete).write()


def prefit_payload(output_dir: str | Path, *, ledger: dict[str, Any], data: dict[str, Any],
                   complete: bool) -> Payload:
    """:func:`publish_prefit`'s file as bytes, not written (a durable block's commit: ``PrivacyLedger._persist``)."""
    record = {"run_id": _run_id(create=True), "complete": complete, "ledger": ledger, "data": data}
    return Payload(Path(output_dir), HANDOFF, (json.dumps(record) + "\n").encode("utf-8"))


def read_prefit(output_dir: str | Path) -> dict[str, Any] | None:
    """The saved pre-fit record of a run (complete or not), or ``None``."""
    path = Path(output_dir) / HANDOFF
    return json.loads(path.read_text()) if path.is_file() else None


def wait_for_prefit(output_dir: str | Path, *, timeout_s: float = 900.0) -> dict[str, Any]:
    """Ranks > 0: the pre-fit state rank 0 published for this run.

    Raises:
        RuntimeError: no shared run id, or nothing published in time.
    """
    run_id = _run_id(create=False)
    if run_id is None:
        raise RuntimeError(f"This is rank {launch_rank()} of a multi-process run started outside Lightning: export "
                           f"{RUN_ID} with one fresh value on every node (e.g. {RUN_ID}=$(date +%s%N)) so that it "
                           "can wait for rank 0's releases.")
    path = Path(output_dir) / HANDOFF
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file():
            payload = json.loads(path.read_text())
            if payload.get("run_id") == run_id and payload.get("complete"):
                return payload
        time.sleep(0.5)
    raise RuntimeError(f"Rank {launch_rank()} waited {timeout_s:.0f} s for rank 0's releases in {str(path)!r}: rank 0 "
                       "failed before training, or the ranks do not share output_dir (it must be on a shared file system).")
