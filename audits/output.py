"""Where an audit report goes: the ``--out`` folder is checked before any work, and both report files are
written together or not at all.

A bad ``--out`` (an existing file, a path under a file, a folder that cannot be written, a full disk) is an
:class:`OutputError` that says which and what to do, raised before any data are read; an error while writing
(the disk filled up meanwhile) is turned into the same error, and leaves neither file nor temporary file behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from lightning_dp.errors import UserError
from lightning_dp.io import fsync_dir

MIN_FREE_BYTES = 32 * 2**20  # a report with its figures is a few MB at most


class OutputError(UserError, OSError):
    """The report cannot be written where ``--out`` says; the message names the path and the fix."""


def _existing_ancestor(folder: Path) -> Path:
    """The nearest part of ``folder``'s path that exists (``folder`` itself when it does)."""
    here = folder
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def check_output_folder(out: str | Path) -> Path:
    """Check, creating nothing, that report files can be written into ``out`` (created later if absent).

    Args:
        out: the ``--out`` folder.

    Returns:
        ``out`` as an absolute path.

    Raises:
        OutputError: ``out`` is a file, lies under a file, cannot be written (permissions, a read-only file
            system), or its file system has less than 32 MiB free.
    """
    folder = Path(out).expanduser().absolute()
    fix = "Pass --out a folder that can be written (it is created if absent)."
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"--out {str(out)!r} is a file, not a folder. {fix}")
    base = _existing_ancestor(folder)
    if not base.is_dir():
        raise OutputError(
            f"--out {str(out)!r} cannot be created: {str(base)!r} is a file, not a folder. {fix}"
        )
    try:  # the only reliable test (permissions, read-only mounts, ACLs, root on a read-only file system)
        fd, probe = tempfile.mkstemp(prefix=".audit-write-test.", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputError(
            f"--out {str(out)!r} cannot be written ({str(base)!r}: {err.strerror}). {fix}"
        ) from err
    free = shutil.disk_usage(base).free
    if free < MIN_FREE_BYTES:
        raise OutputError(
            f"--out {str(out)!r}: only {free / 2**20:.1f} MiB free on its disk, the report needs up to "
            f"{MIN_FREE_BYTES // 2**20} MiB. Free some space or choose another --out."
        )
    return folder


def write_files(folder: str | Path, texts: Mapping[str, str]) -> dict[str, str]:
    """Write every ``name -> text`` into ``folder`` as one unit: all are written to temporary files beside
    their targets and fsync'd, then renamed into place; an error before the renames removes the temporary
    files and leaves any previous files untouched.

    Returns:
        ``name -> path``.

    Raises:
        OutputError: the folder cannot be created or a file cannot be written (e.g. a full disk).
    """
    folder = Path(folder)
    temps: dict[str, str] = {}
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            temps[name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for name, tmp in temps.items():
            os.replace(tmp, folder / name)
        fsync_dir(folder)
    except OSError as err:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise OutputError(
            f"Could not write the report into {str(folder)!r}: {err.strerror or err}. Free some space or choose "
            "another --out; no report file was written."
        ) from err
    return {name: str(folder / name) for name in texts}
