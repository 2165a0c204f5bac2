"""Atomic file writes: a file is either absent or complete, never half-written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    The rename is atomic on POSIX file systems, so readers never see a partial file, and an error in
    ``write`` leaves any previous ``path`` untouched. The file and then its folder are fsync'd, so once
    this returns the new content survives a crash of the machine too.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # the permissions of an ordinary new file, not mkstemp's 0600
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
