"""One error type for the user's mistakes, so that entry points can tell them from bugs.

A :class:`UserError` is a problem with what the user gave (a setting, a data file, a schema, a run
folder, a checkpoint) or with the machine (a full disk, a folder it cannot write): its message names
the problem and the fix in one or two lines, and ``train.py``, ``python -m lightning_dp.sample`` and
``python -m audits`` print it and exit with code 2, without a traceback. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake in the user's input or environment; the message says what to change."""


class ConfigError(UserError, ValueError):
    """A setting is out of range; the message names it and a valid value."""


class StorageError(UserError, OSError):
    """The run could not write its files (full disk, permissions); what was released is on disk already."""


class RunExistsError(UserError, FileExistsError):
    """The output folder already holds a run (continue it with resume=last, or choose another folder)."""


def python_command() -> str:
    """The interpreter as a command to paste into messages: ``.venv/bin/python`` run from the project root,
    else its absolute path (a bare ``python`` fails without an activated venv)."""
    import os
    import sys

    exe = sys.executable or "python"
    rel = os.path.relpath(exe) if os.path.isabs(exe) else exe
    return rel if not rel.startswith("..") else exe


class BudgetExceededError(UserError, RuntimeError):
    """A release would take the run's spent ε above its target."""


class ReleaseNotSavedError(UserError, RuntimeError):
    """The ledger (or the released value) could not be written to disk, so the release was refused."""
