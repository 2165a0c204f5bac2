"""One process per run folder on a machine: an OS lock (``flock``) held for the whole run.

The lock file lives outside the run folder (a run refused before its first release leaves no folder behind), in
``<tmp>/lightning-dp-locks/``, named by a hash of the folder's real path. The kernel drops the lock when the process
ends, however it ends, so a killed run never leaves a stale lock. Across machines the budget registry's run lease
does the same job (``Registry.open_run``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

from lightning_dp.budget.registry import RunBusyError


def lock_path(output_dir: str | os.PathLike) -> Path:
    """The lock file of a run folder (the same for every spelling of its path)."""
    real = os.path.realpath(output_dir)
    return Path(tempfile.gettempdir()) / "lightning-dp-locks" / (hashlib.sha256(real.encode()).hexdigest()[:32] + ".lock")


class FolderLock:
    """An exclusive, non-blocking lock on a run folder; :meth:`acquire` refuses when another process holds it."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.output_dir = Path(output_dir)
        self.path = lock_path(output_dir)
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock.

        Raises:
            RunBusyError: another process runs in this folder now (its pid is named).
        """
        self.path.parent.mkdir(mode=0o1777, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunBusyError(f"Another process (pid {holder}) is running in {str(self.output_dir)!r} now; two runs "
                               "in one folder would mix their records. Wait for it to end, or choose another "
                               "output_dir.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
