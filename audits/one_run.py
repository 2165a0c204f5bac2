"""A privacy audit of the whole training pipeline in one training run (Steinke, Nasr and Jagielski, "Privacy
Auditing with One (1) Training Run", 2023).

The game (their Algorithm 1): ``m`` canary records are drawn; each is inserted into the training rows
independently with probability ½ (``S_i = ±1``); the pipeline trains ONCE, through the real ``train()`` (data
loading, DP releases, the generator, sampling); the auditor scores every canary from the synthetic rows alone and
guesses "in" for the ``k+`` highest scores, "out" for the ``k−`` lowest, and abstains on the rest. If the pipeline
is (ε, δ)-DP, the number ``V`` of correct guesses among the ``r = k+ + k−`` made is stochastically dominated by a
Binomial(r, e^ε / (1 + e^ε)) up to a δ term (their Theorem 3.1 with abstention; the δ term is the one of their
code, :func:`p_value`). So ``v`` correct guesses reject ε at level ``p`` when ``p_value(m, r, v, ε, δ) < p``, and
the largest such ε is a lower bound on the pipeline's ε with confidence ``1 − p`` (:func:`epsilon_lower_bound`).
A bound above the claimed ε means the claim (or the code) is wrong; a bound below it says only that this attack
with ``m`` canaries cannot tell (one run gives a weaker bound than many runs would).

Canaries are records drawn at random from the schema's public domain (categories uniformly, numbers uniformly
within the public bounds, else HOLDOUT's range): unusual combinations, as far from the real rows as the schema
allows, so that their inclusion is as visible as possible. Every attack that applies scores them, and the
confidence is split among the attacks (Bonferroni) as it is among the ``(k+, k−)`` tried, so the reported largest
bound stays valid:

* ``black_box``: each canary's best record-linkage match weight to the synthetic rows (:mod:`audits.linkage`,
  weights fitted on the training rows WITHOUT canaries, so that no score depends on the bits except through the
  synthetic rows);
* ``embedding`` (DP-MERF): the released mean embedding in the checkpoint, the rows without canaries known
  (:func:`audits.white_box.dp_merf_embedding_scores`);
* ``gradient`` (runs trained with DP-SGD): a second, independent set of Dirac gradient canaries inserted into
  DP-SGD's clipped sum, scored from every step's release (:class:`audits.white_box.InsertDiracCanaries`). Their
  coordinates are public and their bits independent of the row canaries', so each set's bound is valid with the
  other set's randomness counted as the mechanism's.

Command::

    python -m audits one-run --canaries 1000 --out DIR [--seed 0] [--confidence 0.95] [--gradient-canaries M] \
        -- experiment=dp_merf_adult

writes ``DIR/one_run.json`` (private: the inclusion bits and scores come from a run on the real rows) and the
run's artefacts under ``DIR/run``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binom

from audits.linkage import MatchWeights, best_matches
from audits.white_box import SPARSE_RATE, SPIKE_WINDOW, InsertDiracCanaries, dp_merf_embedding_scores

log = logging.getLogger(__name__)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


# ------------------------------------------------------------------------------------------ the bound
def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """``P[V ≥ v]`` for ``r`` guesses about ``m`` canaries of an (ε, δ)-DP pipeline (Steinke et al. 2023, Thm 3.1
    and its δ term): ``P[Binomial(r, q) ≥ v] + 2 m δ · max_i P[v − i ≤ Binomial(r, q) < v] / i``, ``q = e^ε/(1+e^ε)``.

    Args:
        m: canaries, each included with probability ½.
        r: guesses made (not abstained).
        v: correct guesses.
        epsilon, delta: the DP guarantee under test.

    Returns:
        The p-value, at most 1.
    """
    if not 0 <= v <= r <= m or epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(
            f"p_value needs 0 <= v <= r <= m, ε >= 0, δ in [0, 1]; got m={m}, r={r}, v={v}, ε={epsilon}"
        )
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if v == 0 or delta == 0:
        return min(1.0, tail)
    below = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))  # i = 1..v: P[v - i <= B < v]
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, tail + alpha * delta * 2 * m)


def epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, p: float) -> float:
    """The largest ε that ``v`` correct of ``r`` guesses reject at level ``p`` (0 when none is): a lower bound on
    the pipeline's ε with confidence ``1 − p``. Bisection to 1e-4 (``p_value`` falls as ε grows)."""
    if p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < p:
        lo, hi = hi, 2 * hi
        if hi > 1e3:
            return lo
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < p else (lo, mid)
    return lo


def guess_grid(m: int) -> list[tuple[int, int]]:
    """The ``(k+, k−)`` tried: "in" guesses only, and as many "in" as "out", for ``r`` = 5%, 10%, 20%, 50% of m."""
    grid = []
    for share in (0.05, 0.1, 0.2, 0.5):
        r = max(2, int(round(share * m)))
        grid += [(r, 0), (r // 2, r // 2)]
    return sorted(set(grid))


def audit_scores(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    grid: Sequence[tuple[int, int]] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """ε lower bounds from canary scores (higher = guessed "in") and the true inclusion bits.

    Ties are broken at random (``seed``), independently of the bits. Every ``(k+, k−)`` of ``grid`` is tested at
    level ``(1 − confidence) / len(grid)`` (Bonferroni), so the largest bound holds with ``confidence``.

    Returns:
        ``{"epsilon_lower_bound", "best": {k_plus, k_minus, r, v}, "guesses": [...], "confidence", "delta", "m"}``.
    """
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = len(scores)
    grid = list(grid or guess_grid(m))
    p = (1.0 - confidence) / len(grid)
    tiebreak = np.random.default_rng(seed).random(m)
    order = np.lexsort((tiebreak, -scores))  # highest score first
    rows = []
    for k_plus, k_minus in grid:
        if k_plus + k_minus > m:
            continue
        pos, neg = order[:k_plus], order[m - k_minus :] if k_minus else order[:0]
        v = int(included[pos].sum() + (~included[neg]).sum())
        r = k_plus + k_minus
        rows.append(
            {
                "k_plus": k_plus,
                "k_minus": k_minus,
                "r": r,
                "v": v,
                "epsilon": epsilon_lower_bound(m, r, v, delta=delta, p=p),
            }
        )
    best = max(rows, key=lambda row: row["epsilon"])
    return {
        "epsilon_lower_bound": best["epsilon"],
        "best": best,
        "guesses": rows,
        "confidence": confidence,
        "per_test_level": p,
        "delta": delta,
        "m": m,
        "included": int(included.sum()),
    }


# ------------------------------------------------------------------------------------------ canaries
def draw_canaries(schema: Any, holdout: pd.DataFrame, m: int, rng: np.random.Generator) -> pd.DataFrame:
    """``m`` records drawn uniformly from the schema's public domain (numbers within their public bounds, else
    HOLDOUT's range; integers rounded)."""
    cols = {}
    for col in schema.columns:
        if col.type == "continuous":
            if col.bounds is not None:
                lo, hi = (float(b) for b in col.bounds)
            else:
                x = pd.to_numeric(holdout[col.name], errors="coerce").dropna()
                lo, hi = float(x.min()), float(x.max())
            x = rng.uniform(lo, hi, m)
            cols[col.name] = np.round(x) if getattr(col, "integer", False) else x
        else:
            if not col.categories:
                raise ValueError(
                    f"column {col.name!r} has no public categories in the schema: canaries cannot be drawn from its "
                    "domain without reading private rows; list its categories in the schema."
                )
            cols[col.name] = rng.choice([str(c) for c in col.categories], m)
    return pd.DataFrame(cols)


def canary_scores(
    canaries: pd.DataFrame, synthetic: pd.DataFrame, real: pd.DataFrame, numeric: list[str]
) -> np.ndarray:
    """Each canary's best match weight to a synthetic row, weights fitted on ``real`` (the rows without canaries)."""
    weights = MatchWeights().fit(real, numeric)
    return best_matches(weights.transform(canaries), weights.transform(synthetic))[0]


# ------------------------------------------------------------------------------------------ the run
def _compose(overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def one_run(
    overrides: Sequence[str],
    *,
    canaries: int,
    out: str | Path,
    seed: int = 0,
    confidence: float = 0.95,
    gradient_canaries: int | None = None,
) -> dict[str, Any]:
    """Insert ``canaries`` row canaries with probability ½ each (and, when the run trains with DP-SGD,
    ``gradient_canaries`` Dirac gradient canaries, default as many; 0 for none), train once with ``overrides``
    (``train.py``'s), score the canaries with every attack that applies and bound ε (module docstring). Writes
    ``out/one_run.json`` and the run under ``out/run``; returns the same dict.

    Raises:
        ValueError: image data, too few canaries, a schema without public categories, or bad overrides.
    """
    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.data.sources import load_source
    from lightning_dp.privacy.ledger import PrivacyLedger
    from lightning_dp.privacy.mechanisms import noise_generator
    from lightning_dp.train import train

    if canaries < 20:
        raise ValueError(f"--canaries must be at least 20 (the bound needs guesses), got {canaries}.")
    if gradient_canaries is not None and 0 < gradient_canaries < 20 or (gradient_canaries or 0) < 0:
        raise ValueError(f"--gradient-canaries must be 0 (none) or at least 20, got {gradient_canaries}.")
    out = Path(out)
    if (out / "one_run.json").exists() or (out / "run").exists():
        raise ValueError(f"{str(out)!r} already holds a one-run audit; pass a new --out folder.")
    start = time.time()
    cfg = _compose(overrides)
    data = {k: v for k, v in cfg.data.items()}
    dm = PrivateDataModule(**data)
    dm.prepare(
        PrivacyLedger(target_epsilon=1e6, delta=1e-5), generator=noise_generator(seed)
    )  # only the split
    if dm.kind != "tabular":
        raise ValueError("the one-run audit draws tabular canaries; image data are not supported.")
    source = load_source(data["name"], **{k: data.get(k) for k in ("root", "path", "schema", "test_path")})
    schema = source.schema
    rng = np.random.default_rng(seed)
    drawn = draw_canaries(schema, dm.holdout, canaries, rng)
    included = rng.random(canaries) < 0.5  # S_i = +1 with probability 1/2
    folder = out / "data"
    folder.mkdir(parents=True, exist_ok=True)
    train_rows = pd.concat([dm.train_frame, drawn[included]], ignore_index=True)
    train_rows = train_rows.iloc[rng.permutation(len(train_rows))]  # canaries not at the end
    na = schema.missing_values[0] if schema.missing_values else ""  # missing cells as the schema reads them
    train_rows.to_csv(folder / "train.csv", index=False, na_rep=na)
    dm.holdout.to_csv(folder / "holdout.csv", index=False, na_rep=na)
    import yaml

    (folder / "schema.yaml").write_text(yaml.safe_dump(schema.to_dict(), sort_keys=False))
    run_cfg = _compose(
        [
            *overrides,
            "data=csv",
            f"data.path={folder / 'train.csv'}",
            f"data.schema={folder / 'schema.yaml'}",
            f"data.test_path={folder / 'holdout.csv'}",
            "data.public_num_rows=null",  # the count now depends on the inclusion bits: released with DP
            "data.max_rows=null",  # the rows are already the run's training rows
            f"output_dir={out / 'run'}",
        ]
    )
    gradient_canaries = canaries if gradient_canaries is None else gradient_canaries
    gradient = InsertDiracCanaries(canaries=gradient_canaries, seed=seed, required=False) if gradient_canaries else None
    result = train(run_cfg, callbacks=[gradient] if gradient else [])
    synthetic = (
        pd.read_csv(result["synthetic"])
        if str(result["synthetic"]).endswith(".csv")
        else pd.read_parquet(result["synthetic"])
    )
    numeric = [c.name for c in schema.columns if c.type == "continuous"]
    real = _typed(dm.train_frame, numeric)
    ledger = json.loads(Path(result["ledger"]).read_text())
    delta = float(ledger["delta"])
    scored: dict[str, tuple[np.ndarray, np.ndarray, str]] = {  # attack -> (scores, bits, what it reads)
        "black_box": (
            canary_scores(_typed(drawn, numeric), _typed(synthetic[real.columns], numeric), real, numeric),
            included,
            "row canaries; score = best record-linkage match weight to a synthetic row (synthetic rows only)",
        )
    }
    if _releases_embedding(run_cfg):
        scored["embedding"] = (
            dp_merf_embedding_scores(result["checkpoint"], dm.train_frame, drawn, schema),
            included,
            "the same row canaries; score = least-squares weight of h(canary) in the released DP-MERF embedding "
            "(checkpoint), the rows without canaries known",
        )
    if gradient is not None and gradient.canaries is not None:
        g = gradient.canaries
        scored["gradient"] = (
            g.attack_scores(),
            g.included,
            f"{len(g.included)} Dirac gradient canaries of DP-SGD (σ = {gradient.noise_multiplier:.4g}, "
            f"{g.steps} steps, q = {g.sample_rate:.4g}, {g.sampled} canary examples sampled); score = "
            + ("spike likelihood ratio of the detrended per-step release at the canary's coordinate"
               if g.sample_rate <= SPARSE_RATE and g.steps >= SPIKE_WINDOW else "Σ_t release_t[k_j] / C"),
        )
    each = 1.0 - (1.0 - confidence) / len(scored)  # Bonferroni over the attacks: the largest bound holds jointly
    attacks = {}
    for name, (scores, bits, what) in scored.items():
        attacks[name] = {
            **audit_scores(scores, bits, delta=delta, confidence=each, seed=seed),
            "attack": what,
            "scores": {"included": scores[bits].tolist(), "excluded": scores[~bits].tolist()},
        }
    top = max(attacks, key=lambda a: attacks[a]["epsilon_lower_bound"])
    res = {
        "epsilon_lower_bound": attacks[top]["epsilon_lower_bound"],
        "attack": top,
        "best": attacks[top]["best"],
        "confidence": confidence,
        "m": canaries,
        "included": int(included.sum()),
        "attacks": attacks,
    }
    res.update(
        {
            "claimed_epsilon": float(ledger["epsilon"]),
            "claimed_delta": delta,
            "violation": res["epsilon_lower_bound"] > float(ledger["epsilon"]),
            "overrides": list(overrides),
            "run": str(out / "run"),
            "training_rows": len(train_rows),
            "synthetic_rows": len(synthetic),
            "seconds": round(time.time() - start, 1),
            "private": "Computed from a run on the real rows: the inclusion bits and scores are not DP. Handle "
            "like the private data.",
        }
    )
    tmp = out / "one_run.json.tmp"
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(out / "one_run.json")
    return res


def _releases_embedding(cfg: Any) -> bool:
    """Whether the run's model is DP-MERF (the released embedding the white-box embedding attack reads)."""
    return str(cfg.model.module.get("_target_", "")).endswith("dp_merf.DPMERF")


def _typed(frame: pd.DataFrame, numeric: list[str]) -> pd.DataFrame:
    out = frame.copy()
    for c in out.columns:
        out[c] = pd.to_numeric(out[c], errors="coerce") if c in numeric else out[c].astype(str)
    return out


def main(argv: Sequence[str]) -> int:
    """``python -m audits one-run``: exit 0 when the bound does not exceed the claimed ε, 1 when it does, 2 bad
    input."""
    import argparse
    import sys

    from lightning_dp.errors import UserError

    parser = argparse.ArgumentParser(
        prog="python -m audits one-run",
        description="One-run privacy audit of the pipeline (Steinke, Nasr, Jagielski 2023): canaries in, train "
        "once, an ε lower bound against the claimed ε.",
    )
    parser.add_argument(
        "--canaries", type=int, default=1000, help="m: canaries, each inserted with probability ½"
    )
    parser.add_argument("--out", required=True, help="a new folder for one_run.json and the run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the canaries and their inclusion bits")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound")
    parser.add_argument(
        "--gradient-canaries", type=int, default=None,
        help="Dirac gradient canaries when the run trains with DP-SGD (default: as many as --canaries; 0: none)",
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. experiment=dp_merf_adult")
    args = parser.parse_args(list(argv))
    if not 0.5 <= args.confidence < 1:
        print(f"error: --confidence must be in [0.5, 1), got {args.confidence}.", file=sys.stderr)
        return 2
    try:
        res = one_run(
            args.overrides, canaries=args.canaries, out=args.out, seed=args.seed, confidence=args.confidence,
            gradient_canaries=args.gradient_canaries,
        )
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, a in res["attacks"].items():
        b = a["best"]
        print(f"  {name}: ε ≥ {a['epsilon_lower_bound']:.3f} (m = {a['m']}, {a['included']} inserted; {b['v']} of "
              f"{b['r']} guesses correct)")
    print(
        f"one-run audit: ε ≥ {res['epsilon_lower_bound']:.3f} with {res['confidence']:.0%} confidence (the "
        f"{res['attack']} attack; {len(res['attacks'])} attacks, Bonferroni) against the claimed ε = "
        f"{res['claimed_epsilon']:.4g}; {res['seconds']} s. "
        + ("VIOLATION: the bound exceeds the claim." if res["violation"] else "No violation found.")
    )
    return 1 if res["violation"] else 0
