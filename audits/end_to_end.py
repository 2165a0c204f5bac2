"""End-to-end privacy audit of a whole run: neighbouring files in, every artefact out.

The mechanism-level canaries (``canary.py``) test the noise; this tests everything around it. It runs the
real ``train(cfg)`` many times on a CSV file ``D`` and on ``D' = D + one planted row``, reads **every file**
the run leaves in its output folder (checkpoint, synthetic data, ``ledger.json``, metrics, configs) plus the
log records it emitted, and asks whether any of them tells the two apart:

* :func:`find_deterministic_leaks` (fast, a few runs): a value that is the same in every run on D and in every
  run on D' (so it does not come from the privacy noise) but differs between them is a deterministic function
  of the data, e.g. the exact n
  in a sample rate or a row count, or a split that moves when a row is added. There must be none.
* :func:`epsilon_lower_bounds` (slow, hundreds of runs): for each artefact a linear score over its numbers,
  learned on the first half of the runs (the features with the largest |t|, weighted by their standardised
  difference of means), its threshold chosen on that half too, and the ε lower bound of Jagielski et al. 2020
  on the second half (``empirical_dp.py``). A Bonferroni correction over the artefacts keeps the maximum a
  valid lower bound at ``confidence``. For a correct pipeline it stays below the claimed ε.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from audits.empirical_dp import _counts, epsilon_lower_bound, select_threshold

# Values that legitimately differ between any two runs: wall-clock times and the run's own folder.
VOLATILE_KEYS = (
    "first_at",
    "last_at",
    "output_dir",
    "run_id",
    "dirpath",
    "best_model_path",
    "last_model_path",
    "kth_best_model_path",
    "versions",
)
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:\d{2}|Z)?")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
# identifiers that mix letters and digits (a hash, a run id, ``fp-72b77cf3f793``): splitting their numbers out would
# scatter them over a line's number slots, where a random id on the same line hides a deterministic one
_TOKEN = re.compile(r"[A-Za-z0-9_-]*(?:[A-Za-z][A-Za-z0-9_-]*\d|\d[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]*")


# ------------------------------------------------------------------------------------------ artefacts
def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of every scalar in nested dicts/lists/tensors, volatile keys left out."""
    import torch

    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if str(k) not in VOLATILE_KEYS:
                yield from _leaves(v, f"{prefix}/{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}[{i}]")
    elif isinstance(obj, torch.Tensor):
        yield f"{prefix}#shape", str(tuple(obj.shape))
        yield prefix, obj.detach().cpu().reshape(-1).double().numpy()
    elif isinstance(obj, np.ndarray):
        yield f"{prefix}#shape", str(obj.shape)
        yield prefix, obj.reshape(-1).astype(np.float64)
    elif isinstance(obj, bool | int | float | np.integer | np.floating):
        yield prefix, float(obj)
    elif obj is None:
        yield prefix, "None"
    else:
        yield prefix, _TIME.sub("<time>", str(obj))


def _table_summary(df: pd.DataFrame) -> dict[str, Any]:
    """Aggregates of a table that any leak through its rows would move: size, moments, category shares."""
    out: dict[str, Any] = {"rows": float(len(df)), "columns": ",".join(map(str, df.columns))}
    for c in df.columns:
        num = pd.to_numeric(df[c], errors="coerce")
        if len(df) and num.notna().mean() > 0.9:
            v = num.dropna()
            out.update({f"{c}/mean": v.mean(), f"{c}/std": v.std(), f"{c}/min": v.min(), f"{c}/max": v.max()})
        else:
            for cat, share in df[c].astype(str).value_counts(normalize=True).items():
                out[f"{c}={cat}"] = float(share)
    return {
        k: (float(v) if isinstance(v, float | np.floating) and math.isfinite(v) else v)
        for k, v in out.items()
    }


def read_artefacts(run_dir: str | Path, log_text: str = "") -> dict[str, dict[str, Any]]:
    """Every file of a run's output folder (and its log text) as ``{artefact: {key: number or string}}``.

    Raises:
        ValueError: a file of a kind this audit cannot read, so that no new artefact goes unchecked.
    """
    import torch

    run_dir = Path(run_dir)
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(run_dir).as_posix()
        suffix = path.suffix.lower()
        if suffix == ".ckpt":
            # a (file name with the epoch/step) is itself an artefact: the key keeps the name's numbers out
            name = re.sub(r"=\d+", "=N", rel)
            out[name] = dict(_leaves(torch.load(path, map_location="cpu", weights_only=True)))
            out[f"{name}#name"] = {"name": rel}
        elif suffix == ".json":
            out[rel] = dict(_leaves(json.loads(path.read_text())))
        elif suffix in (".yaml", ".yml"):
            out[rel] = dict(_leaves(yaml.safe_load(path.read_text())))
        elif suffix == ".csv":
            out[rel] = _table_summary(pd.read_csv(path, dtype=str, keep_default_na=False))
        elif suffix == ".parquet":
            out[rel] = _table_summary(pd.read_parquet(path))
        elif suffix == ".npz":
            with np.load(path) as z:
                out[rel] = {f"{k}/{s}": float(getattr(z[k], s)()) for k in z.files for s in ("mean", "std")}
                out[rel].update({f"{k}#len": float(len(z[k])) for k in z.files})
        elif suffix in (".png", ".log", ".txt"):
            text = path.read_text(errors="replace") if suffix != ".png" else ""
            out[rel] = {"bytes": float(path.stat().st_size), **_text_numbers(text)}
        else:
            raise ValueError(
                f"{rel}: the end-to-end audit cannot read this kind of artefact; teach read_artefacts."
            )
    out["<log records>"] = _text_numbers(log_text)
    return out


def _text_numbers(text: str) -> dict[str, Any]:
    text = _TIME.sub("<time>", text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out: dict[str, Any] = {"lines": float(len(lines))}
    for i, line in enumerate(lines):
        out[f"line{i}"] = _NUMBER.sub("#", line)
        for j, num in enumerate(_NUMBER.findall(line)):
            out[f"line{i}/{j}"] = float(num)
    for token in sorted(set(_TOKEN.findall(text))):  # present or absent, wherever it stands
        out[f"token:{token}"] = 1.0
    return out


# ------------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    """The artefacts of one run and whether it had the planted row."""

    artefacts: dict[str, dict[str, Any]]
    with_canary: bool


def capture_run(run: Callable[[], Path]) -> dict[str, dict[str, Any]]:
    """Run ``run`` (which returns its output folder) while capturing every log record it emits."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        out = run()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    return read_artefacts(out, stream.getvalue())


def deterministic_leaks(
    on_d: list[Mapping[str, Mapping[str, Any]]], on_d_prime: list[Mapping[str, Mapping[str, Any]]]
) -> list[str]:
    """Keys whose value is the same in every run on D and the same in every run on D', but differs between them.

    Such a value does not come from the privacy noise (the runs on one side agree) yet tells D from D': a
    deterministic function of the data. A noisy value that takes few levels (a step count from a DP row
    count, a rounded log line) can agree by chance in a few runs; :func:`find_deterministic_leaks` adds runs
    until such coincidences are gone.

    Returns:
        ``"artefact: key (D: value, D': value)"`` for each leak; empty for a pipeline whose every artefact is
        noise-dependent or data-independent.
    """
    leaks = []
    runs = [*on_d, *on_d_prime]
    for name in sorted({n for run in runs for n in run}):
        d_has, p_has = {name in r for r in on_d}, {name in r for r in on_d_prime}
        if len(d_has) == len(p_has) == 1 and d_has != p_has:
            leaks.append(f"{name}: present on D={d_has.pop()}, on D'={p_has.pop()}")
        if not all(name in r for r in runs):
            continue
        for key in sorted({k for r in runs for k in r[name]}):
            d_vals, p_vals = [r[name].get(key) for r in on_d], [r[name].get(key) for r in on_d_prime]
            if (
                all(_same(d_vals[0], v) for v in d_vals)
                and all(_same(p_vals[0], v) for v in p_vals)
                and not _same(d_vals[0], p_vals[0])
            ):
                leaks.append(f"{name}: {key} (D: {_short(d_vals[0])}, D': {_short(p_vals[0])})")
    return leaks


def find_deterministic_leaks(
    run_d: Callable[[], Mapping[str, Mapping[str, Any]]],
    run_d_prime: Callable[[], Mapping[str, Mapping[str, Any]]],
    *,
    max_runs: int = 8,
) -> list[str]:
    """Two runs per side, then one more per side while any value looks deterministic (up to ``max_runs``).

    A truly deterministic value stays flagged however many runs are added; a noisy value with a few levels
    that agreed by chance stops agreeing.
    """
    on_d, on_p = [run_d(), run_d()], [run_d_prime(), run_d_prime()]
    leaks = deterministic_leaks(on_d, on_p)
    while leaks and len(on_d) < max_runs:
        on_d.append(run_d())
        on_p.append(run_d_prime())
        leaks = deterministic_leaks(on_d, on_p)
    return leaks


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


def _short(v: Any) -> str:
    return f"array{v.shape}" if isinstance(v, np.ndarray) else repr(v)


def _matrix(runs: list[Run], name: str) -> tuple[np.ndarray, list[str]]:
    """Numeric features of artefact ``name`` over runs; strings become indicators of their value."""
    rows = [r.artefacts.get(name, {}) for r in runs]
    keys = sorted({k for row in rows for k in row})
    columns = []
    for k in keys:
        values = [row.get(k) for row in rows]
        if all(isinstance(v, np.ndarray) for v in values) and len({v.shape for v in values}) == 1:
            block = np.stack(values)  # (runs, size)
            columns += [(f"{k}[{i}]", block[:, i]) for i in range(block.shape[1])]
        elif all(isinstance(v, float) for v in values):
            columns.append((k, np.array(values, dtype=float)))
        elif any(isinstance(v, np.ndarray) for v in values):
            continue  # arrays whose shape differs between runs: the "#shape" key carries that difference
        else:
            for level in sorted({str(v) for v in values}):
                columns.append((f"{k}=={level}", np.array([float(str(v) == level) for v in values])))
    if not columns:
        return np.zeros((len(runs), 0)), []
    return np.nan_to_num(np.column_stack([c for _, c in columns]), posinf=0.0, neginf=0.0), [
        k for k, _ in columns
    ]


@dataclass
class ArtefactBound:
    """The ε lower bound from one artefact, with the features its score used."""

    artefact: str
    epsilon_lower_bound: float
    selection_epsilon: float
    features: list[str]
    false_positives: int
    false_negatives: int
    n_per_side: int


def epsilon_lower_bounds(
    runs: list[Run], *, delta: float, confidence: float = 0.95, top_features: int = 20
) -> list[ArtefactBound]:
    """ε lower bound per artefact, jointly valid at ``confidence`` (Bonferroni over artefacts).

    Runs are split in halves per side (first half: features, weights, threshold; second half: the bound).
    """
    with_c = [r for r in runs if r.with_canary]
    without = [r for r in runs if not r.with_canary]
    h_w, h_wo = len(with_c) // 2, len(without) // 2
    ordered = with_c[:h_w] + without[:h_wo] + with_c[h_w:] + without[h_wo:]
    names = sorted({n for r in runs for n in r.artefacts})
    level = 1 - (1 - confidence) / max(len(names), 1)
    results = []
    for name in names:
        x, keys = _matrix(ordered, name)
        sel_w, sel_wo = x[:h_w], x[h_w : h_w + h_wo]
        ev_w, ev_wo = x[h_w + h_wo : h_w + h_wo + len(with_c) - h_w], x[h_w + h_wo + len(with_c) - h_w :]
        if x.shape[1] == 0:
            continue
        diff = sel_w.mean(0) - sel_wo.mean(0)
        var = (sel_w.var(0) + sel_wo.var(0)) / 2
        scale = np.sqrt(var + 1e-12 * (1 + np.abs(sel_w).mean(0)) ** 2)
        t = np.where(np.abs(diff) > 0, diff / scale, 0.0)
        pick = np.argsort(-np.abs(t))[:top_features]
        pick = pick[np.abs(t[pick]) > 0]
        weights = np.zeros(x.shape[1])
        weights[pick] = t[pick] / scale[pick]
        center = (sel_w.mean(0) + sel_wo.mean(0)) / 2

        def score(m: np.ndarray, weights: np.ndarray = weights, center: np.ndarray = center) -> np.ndarray:
            return (m - center) @ weights

        thr, sign, sel_eps = select_threshold(score(sel_w), score(sel_wo), delta=delta, confidence=level)
        fp, fn = (int(v[0]) for v in _counts(score(ev_w), score(ev_wo), np.array([thr]), sign))
        eps = epsilon_lower_bound(
            false_positives=fp,
            false_negatives=fn,
            n_negatives=len(ev_wo),
            n_positives=len(ev_w),
            delta=delta,
            confidence=level,
        )
        results.append(ArtefactBound(name, eps, sel_eps, [keys[i] for i in pick[:5]], fp, fn, len(ev_w)))
    return sorted(results, key=lambda r: -r.epsilon_lower_bound)
