"""The candidates' own output, to a private file only: the console and ``train.log`` stay silent about K.

Papernot & Steinke's Theorem 2 covers the chosen candidate and its score, not the number K of candidates
tried, their settings or their counts. A candidate is a whole training run that logs (its DP count, its
releases), prints Lightning's lines and may draw a progress bar; a scheduler writes all of that to a shared
log. :func:`private_output` sends every log record, every ``print`` and every warning of the block to one file
labelled private, and nothing to the console.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from lightning_dp.run_log import FORMAT

HEADER = ("# PRIVATE: the tuning candidates' own logs (K, each candidate's settings, DP counts and releases). Not "
          "covered by the run's DP guarantee (Papernot & Steinke cover only the chosen candidate and its score): "
          "do not publish this file.\n")
# loggers that may hold their own console handlers (Lightning adds one at import when the root has none)
OWN_HANDLERS = ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric", "lightning")
# loggers whose records still reach the console during the block: none. The selection's public progress lines are
# its start and end, written outside the block (``Progress.hidden``); its heartbeats, whose number grows with the
# selection's duration and so with K, come here through the sink this block yields
PUBLIC_LOGGERS: tuple[str, ...] = ()


class _Only(logging.Filter):
    """Pass the records of the named loggers only."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name in self.names


@contextlib.contextmanager
def private_output(path: Path) -> Iterator[Callable[[str], None]]:
    """Within the block, every log record, ``stdout``/``stderr`` write and warning goes to ``path``, and nothing to
    the console or ``train.log`` (``PUBLIC_LOGGERS``). Yields a function that writes one line to ``path`` (for the
    progress heartbeats: :meth:`lightning_dp.progress.Progress.private_sink`).

    The root logger's handlers (the console, a run's ``train.log``) pass only those records for the block, and the
    console handlers Lightning's loggers carry are detached; all is put back after it, whatever happens.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    saved_root = root.handlers[:]
    named = [logging.getLogger(name) for name in OWN_HANDLERS]
    saved_named = [(lg.handlers[:], lg.propagate) for lg in named]
    with open(path, "a", encoding="utf-8") as stream:
        if stream.tell() == 0:
            stream.write(HEADER)
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(FORMAT))
        only_public = _Only(PUBLIC_LOGGERS)
        for h in saved_root:
            h.addFilter(only_public)
        root.handlers = [handler, *saved_root]
        for lg in named:
            lg.handlers, lg.propagate = [], True
        try:
            with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
                yield lambda text: handler.handle(logging.makeLogRecord(
                    {"name": "lightning_dp.progress", "levelno": logging.INFO, "levelname": "INFO", "msg": text}))
        finally:
            handler.flush()
            for h in saved_root:
                h.removeFilter(only_public)
            root.handlers = saved_root
            for lg, (handlers, propagate) in zip(named, saved_named, strict=True):
                lg.handlers, lg.propagate = handlers, propagate
            sys.stdout.flush()
