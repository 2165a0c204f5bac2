"""Progress lines for runs that are not watched on a terminal (nohup, a scheduler, CI logs, a notebook).

One process-wide :data:`tracker` knows the current stage (``prepare data``, ``release``, ``train``, ``sample``,
``audit: membership``, ...), its steps done and planned, and the ε spent so far. It writes a line when a
stage starts and then every ``every`` seconds from a background thread, so a long one-shot release or an
audit check that runs minutes without a step still shows the run is alive::

    progress: train | 120/300 DP-SGD steps (40%) | elapsed 1m20s, ETA 2m00s | ε = 0.52 of 1

On a terminal the progress bars do this and the lines stay off (``LIGHTNING_DP_PROGRESS=1`` forces them,
``=0`` silences them; ``LIGHTNING_DP_PROGRESS_SECONDS`` or ``callbacks.progress.every_seconds`` sets the interval).

What a line may show (everything in it is public or DP): stage names (the code's, or the policy's checks);
planned steps that follow from the config and the DP row count (DP-SGD's round(1/q) per epoch, a one-shot
model's ``steps_per_epoch``), never from the exact number of rows; the ledger's ε. A one-shot release streams
the private rows in chunks whose count would follow from n, so it shows elapsed time only.

During tuning (:meth:`Progress.hidden`) the number K of candidates is private, and the selection's duration grows
with K: the public stream gets one line when the selection starts and one when it ends (ε only, no time); the
heartbeats in between (elapsed time and ε) go only to a private sink (the tuning's PRIVATE log file), or nowhere.
Wall-clock time itself (timestamps, file times, a scheduler's accounting) is outside the DP guarantee (README,
"Privacy model").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

log = logging.getLogger("lightning_dp.progress")
DEFAULT_SECONDS = 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(max(seconds, 0.0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def enabled_by_default() -> bool:
    """Off a terminal, unless ``LIGHTNING_DP_PROGRESS`` says otherwise."""
    env = os.environ.get("LIGHTNING_DP_PROGRESS", "").strip().lower()
    if env in ("0", "false", "off", "no"):
        return False
    if env in ("1", "true", "on", "yes"):
        return True
    stream = sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


def default_seconds() -> float:
    try:
        return max(float(os.environ.get("LIGHTNING_DP_PROGRESS_SECONDS", DEFAULT_SECONDS)), 1.0)
    except ValueError:
        return DEFAULT_SECONDS


class Progress:
    """The current stage and a heartbeat thread; see the module docstring. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._depth = 0
        self.every = default_seconds()
        self.enabled = enabled_by_default()
        self._epsilon: Callable[[], str] | None = None
        self._hidden: str | None = None
        self._sink: Callable[[str], None] | None = None  # where a hidden stage's heartbeats go (private)
        self._t0 = time.monotonic()
        self._reset_stage("starting")

    def _reset_stage(self, name: str, total: int | None = None, unit: str = "steps", done: int = 0) -> None:
        self.stage_name, self.total, self.unit, self.done = name, total, unit, done
        self._stage_t0 = time.monotonic()
        self._stage_done0 = done

    # ------------------------------------------------------------- lifetime
    @contextmanager
    def session(self, *, every: float | None = None, enabled: bool | None = None) -> Iterator[Progress]:
        """Lines for the duration of the block (nested sessions share the outer one's clock and thread)."""
        with self._lock:
            self._depth += 1
            outer = self._depth == 1
            if outer:
                self._t0 = time.monotonic()
                self.every = default_seconds() if every is None else max(float(every), 1.0)
                self.enabled = enabled_by_default() if enabled is None else bool(enabled)
                self._stop.clear()
                if self.enabled:
                    self._thread = threading.Thread(target=self._beat, name="lightning-dp-progress", daemon=True)
                    self._thread.start()
        try:
            yield self
        finally:
            with self._lock:
                self._depth -= 1
                last = self._depth == 0
                thread = self._thread if last else None
                if last:
                    self._stop.set()
                    self._thread, self._epsilon, self._hidden, self._sink = None, None, None, None
            if thread is not None:
                thread.join(timeout=5)

    @contextmanager
    def hidden(self, name: str, done: str | None = None) -> Iterator[None]:
        """A stage whose length is private (tuning: it grows with the secret K).

        Public lines: one when the block starts and one when it ends normally (``done``, else ``NAME: done``; ε,
        no time). Inside the block no other stage or step is shown, and the heartbeats (``name``, elapsed time,
        ε) go to the sink given by :meth:`private_sink` only (dropped without one), so the number of public lines
        does not grow with the block's duration.
        """
        self.stage(name)
        with self._lock:
            self._hidden = name
        try:
            yield
        finally:
            with self._lock:
                self._hidden, self._sink = None, None
                self._reset_stage(done or f"{name}: done")
        self._emit(self.line(timing=False))  # not reached when the block raised

    def private_sink(self, write: Callable[[str], None] | None) -> None:
        """Where the current hidden stage's heartbeats go (a private file); cleared when the stage ends."""
        with self._lock:
            self._sink = write if self._hidden is not None else None

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:  # re-entrant: the line and where it goes from the same state
                hidden, sink, text = self._hidden is not None, self._sink, self.line()
            if not hidden:
                self._emit(text)
            elif sink is not None and self.enabled:
                with contextlib.suppress(Exception):  # a progress line never stops a run
                    sink(text)

    # ------------------------------------------------------------- state
    def set_epsilon(self, describe: Callable[[], str] | None) -> None:
        """What ε to show: a function returning e.g. ``ε = 0.52 of 1`` (the ledger's spend, public)."""
        with self._lock:
            if self._hidden is None or describe is None:
                self._epsilon = describe

    def stage(self, name: str, *, total: int | None = None, unit: str = "steps", done: int = 0) -> None:
        """A new stage starts: write its line now (when enabled)."""
        with self._lock:
            if self._hidden is not None:
                return
            self._reset_stage(name, total, unit, done)
        if self._depth:
            self._emit(self.line())

    def update(self, done: int) -> None:
        """Steps done in the current stage."""
        with self._lock:
            if self._hidden is None:
                self.done = int(done)

    def line(self, *, timing: bool = True) -> str:
        with self._lock:
            now = time.monotonic()
            parts = [f"progress: {self._hidden or self.stage_name}"]
            if self._hidden is None and self.total:
                pct = 100.0 * self.done / self.total
                parts.append(f"{self.done}/{self.total} {self.unit} ({pct:.0f}%)")
            elapsed = f"elapsed {_duration(now - self._t0)}"
            rate_done = self.done - self._stage_done0
            if self._hidden is None and self.total and rate_done > 0 and self.done < self.total:
                per = (now - self._stage_t0) / rate_done
                elapsed += f", ETA {_duration(per * (self.total - self.done))}"
            if timing:
                parts.append(elapsed)
            if self._epsilon is not None:
                with contextlib.suppress(Exception):  # a progress line never stops a run
                    parts.append(self._epsilon())
            return " | ".join(parts)

    def _emit(self, text: str) -> None:
        if not self.enabled:
            return
        if log.isEnabledFor(logging.INFO) and log.hasHandlers():
            log.info(text)
        else:  # no logging set up (a notebook, a script): straight to stderr
            print(text, file=sys.stderr, flush=True)


class _Stderr(logging.StreamHandler):
    """The current ``sys.stderr`` at each line (a test or a notebook may swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


@contextmanager
def plain_console() -> Iterator[None]:
    """For a command-line tool whose logging prefixes every line: progress lines go to stderr as they are."""
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = True


tracker = Progress()
log.setLevel(logging.INFO)  # progress lines are the point of this logger; silence them with LIGHTNING_DP_PROGRESS=0
