"""Nothing computed from a release leaves the process before the release is on disk.

A release is *durable* when the ledger that records it, and the released value a resumed run needs
(a one-shot embedding, the DP row count), are written and fsync'd. Until then the noisy value exists
only in memory, and a kill loses nothing: the run simply releases it again after a restart, because
no trace of the first draw left the process. What could leave early are log records (a log line
with the DP bandwidth or the DP count goes to ``train.log`` at once), so :func:`held_logs` keeps every
log record back until the release is durable and drops them if it never becomes so.

The released values of a block reach disk as a :class:`Payload`: the exact bytes of the file that holds them, made
in memory first, so that the budget registry can charge the block and keep those bytes in one transaction before the
file is written (``PrivacyLedger._persist``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lightning_dp.io import atomic_write_bytes


@dataclass(frozen=True)
class Payload:
    """A durable block's released values as the bytes of the file that holds them, not yet on disk.

    Attributes:
        folder: the run's folder.
        path: the file, relative to ``folder``, with ``/`` (``checkpoints/last.ckpt``, ``.prefit.json``).
        data: the file's bytes, exactly as :meth:`write` puts them there.
    """

    folder: Path
    path: str
    data: bytes

    def write(self) -> None:
        """Write the file atomically (temporary file, fsync, rename)."""
        atomic_write_bytes(Path(self.folder) / self.path, self.data)


class _Hold(logging.Filter):
    """Keeps a handler's records back (``filter`` says no) to replay them later."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


class HeldLogs:
    """Log records held back from every handler; :meth:`release` replays them in order, :meth:`discard`
    drops them."""

    def __init__(self) -> None:
        loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                          if isinstance(lg, logging.Logger))]
        handlers = {id(h): h for lg in loggers for h in lg.handlers}
        self._holds = [_Hold(h) for h in handlers.values()]
        for hold in self._holds:
            hold.handler.addFilter(hold)

    def _detach(self) -> None:
        for hold in self._holds:
            hold.handler.removeFilter(hold)

    def release(self) -> None:
        self._detach()
        for hold in self._holds:
            for record in hold.records:
                if record.levelno >= hold.handler.level:
                    hold.handler.handle(record)

    def discard(self) -> int:
        self._detach()
        return sum(len(h.records) for h in self._holds)


@contextmanager
def held_logs() -> Iterator[HeldLogs]:
    """Hold every log record of the block; replayed when the block ends normally, dropped on an error."""
    held = HeldLogs()
    try:
        yield held
    except BaseException:
        dropped = held.discard()
        if dropped:
            logging.getLogger(__name__).warning(
                "%d log records of a release that was not saved were dropped (nothing of it left the run).", dropped)
        raise
    held.release()
