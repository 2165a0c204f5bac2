"""``train.log``: the run's log records, in its folder from its first release on.

Records are buffered from the start of ``train()``; when the run writes its first files (the moment it
spends budget), the buffer goes to ``<output_dir>/train.log`` and later records follow. A run refused
before that leaves no log file behind (its messages went to the console).
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


class RunLog:
    """Buffer log records until :meth:`open` names the file; :meth:`close` detaches everything."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.buffer = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)
        self.buffer.setLevel(level)
        self.file: logging.FileHandler | None = None
        logging.getLogger().addHandler(self.buffer)

    def open(self, path: Path) -> None:
        if self.file is not None:
            return
        self.file = logging.FileHandler(path, encoding="utf-8")
        self.file.setFormatter(logging.Formatter(FORMAT))
        self.buffer.setTarget(self.file)
        self.buffer.flush()
        self.buffer.flushLevel = logging.DEBUG  # from now on every record goes straight to the file

    def close(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.buffer)
        if self.file is not None:
            self.buffer.flush()
            self.file.close()
        self.buffer.close()
