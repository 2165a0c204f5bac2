"""Memory checks before allocating: a size that cannot fit gets a one-line refusal, not a crash or a swap storm.

Sizes come from public facts only (the schema, a network's config, the number of rows asked for), so a check
reveals nothing about the data; it runs before the first release (``preflight.py``) or before a checkpoint's
networks are built (resume, sampling). A model's size is found by building it on PyTorch's ``meta`` device,
which allocates no storage.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lightning_dp.errors import UserError

# share of the machine's available memory one allocation may take before we refuse it
MEMORY_SHARE = 0.8


class ResourceError(UserError, MemoryError):
    """A public size (columns, categories, a network, rows asked for) needs more memory than the machine has."""


def available_memory_bytes() -> int:
    """Memory available to this process now: ``MemAvailable`` on Linux (bounded by a cgroup limit), else total RAM."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            available = min(available, int(text))
    return int(available)


def check_memory(need_bytes: float, *, what: str, fix: str, available: int | None = None) -> None:
    """Refuse an allocation of ``need_bytes`` that would take more than :data:`MEMORY_SHARE` of available memory.

    Args:
        need_bytes: the estimate (from public sizes).
        what: what would be allocated, e.g. ``"the model-space encoding of 32,561 rows × 100,000 columns"``.
        fix: the one thing to change, e.g. ``"declare fewer categories"``.
        available: the memory to compare with (default: :func:`available_memory_bytes`).

    Raises:
        ResourceError: with the need, what is available, and the fix.
    """
    available = available_memory_bytes() if available is None else available
    if need_bytes > MEMORY_SHARE * available:
        raise ResourceError(f"{what} needs about {_gib(need_bytes)} of memory; this machine has {_gib(available)} "
                            f"available. {fix}; nothing was spent.")


def module_bytes(build: Callable[[], Any]) -> int:
    """Bytes of a module's parameters and buffers, measured by building it on the ``meta`` device (no storage).

    Args:
        build: a function that builds the module (e.g. ``lambda: build_model(cfg.model, layout)``).
    """
    import torch

    with torch.device("meta"):
        module = build()
    if not isinstance(module, torch.nn.Module):
        return 0
    tensors = [*module.parameters(), *module.buffers()]
    return int(sum(t.numel() * t.element_size() for t in tensors))


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
