"""The privacy ledger: one accountant per run that composes every release of private information.

Every data-dependent quantity a run publishes (a DP-SGD step, a sanitized embedding, noisy class
counts, a DP bandwidth, DP data bounds, ...) is recorded here *before* it is released. The ledger
composes all releases in Rényi DP (Mironov 2017), converts to (ε, δ) with Balle et al. (2020), and
refuses a release that would push ε past the run's target. Its state travels in every checkpoint,
so a resumed run continues from the ε it had spent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from lightning_dp.errors import BudgetExceededError, ReleaseNotSavedError, UserError  # noqa: F401 (re-exported)
from lightning_dp.io import atomic_write_text
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.durable import Payload

log = logging.getLogger(__name__)

MECHANISMS = ("gaussian", "subsampled_gaussian", "laplace", "exponential", "rdp_curve")
ADJACENCIES = ("add_remove", "replace_one")
ACCOUNTANTS = ("rdp", "prv")
PRV_MAX_POINTS = 2**20  # cap on Opacus' PRV grid (see PrivacyLedger._prv_epsilon)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=256)
def _unit_rdp(mechanism: str, noise_multiplier: float | None, sample_rate: float, epsilon: float | None,
              orders: tuple[float, ...]) -> np.ndarray:
    """RDP curve of one use; cached because DP-SGD asks for the same curve at every step."""
    if mechanism in ("gaussian", "subsampled_gaussian"):
        return mech.gaussian_rdp(orders, noise_multiplier=noise_multiplier, sample_rate=sample_rate)
    if mechanism == "laplace":
        return mech.laplace_rdp(orders, noise_multiplier=noise_multiplier)
    return mech.pure_dp_rdp(orders, epsilon=epsilon)


def _prv_applies(releases: Sequence[Release]) -> bool:
    """PRV (Opacus) covers (subsampled) Gaussian releases only."""
    return all(r.mechanism in ("gaussian", "subsampled_gaussian") for r in releases if r.count)


def _smallest(fits: Callable[[float], bool], low: float, high: float, rtol: float) -> float:
    """Smallest σ in [low, high] with ``fits(σ)``, to ``rtol`` in log σ (``fits`` monotone, true at high).

    Bisection in log σ, which keeps the invariant ``fits(exp(hi))``, so the σ returned always fits.
    """
    if fits(low):
        return low
    lo, hi = math.log(low), math.log(high)
    while hi - lo > rtol:
        mid = (lo + hi) / 2
        if fits(math.exp(mid)):
            hi = mid
        else:
            lo = mid
    return math.exp(hi)


@dataclass(frozen=True)
class Release:
    """One release of private information, possibly repeated ``count`` times.

    Attributes:
        name: what was released (``"dp_merf/embedding"``, ``"dp_sgd/discriminator"``).
        mechanism: one of ``MECHANISMS``.
        sensitivity: L2 (Gaussian) or L1 (Laplace) sensitivity, or the utility sensitivity of the
            exponential mechanism, under the ledger's adjacency.
        noise_multiplier: noise scale / sensitivity (Gaussian, Laplace); ``None`` for exponential.
        epsilon: ε of one use of a pure-DP mechanism (exponential); ``None`` otherwise.
        sample_rate: Poisson sampling rate (``subsampled_gaussian``); 1 otherwise.
        count: number of identical uses composed.
        delta: additive δ of the release beyond its RDP curve (e.g. partition selection).
        note: free text shown in reports (why this release exists, how its sensitivity follows).
        rdp_values: ``rdp_curve`` only: the RDP ε of one use at each of ``rdp_orders`` (e.g. a private selection's
            bound, ``lightning_dp/tuning/selection.py``); ``None`` otherwise.
        rdp_orders: ``rdp_curve`` only: the orders of ``rdp_values``; they must be the ledger's orders.
    """

    name: str
    mechanism: str
    sensitivity: float
    noise_multiplier: float | None = None
    epsilon: float | None = None
    sample_rate: float = 1.0
    count: int = 1
    delta: float = 0.0
    note: str = ""
    first_at: str = field(default_factory=_now)
    last_at: str = field(default_factory=_now)
    rdp_values: tuple[float, ...] | None = None
    rdp_orders: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"Unknown mechanism {self.mechanism!r}; valid: {', '.join(MECHANISMS)}.")
        for key in ("rdp_values", "rdp_orders"):  # tuples, also when read back from JSON lists
            if getattr(self, key) is not None:
                object.__setattr__(self, key, tuple(float(v) for v in getattr(self, key)))
        if self.mechanism == "rdp_curve":
            if self.rdp_values is None or self.rdp_orders is None or len(self.rdp_values) != len(self.rdp_orders):
                raise ValueError(f"Release {self.name!r}: rdp_curve needs rdp_values and rdp_orders of the same "
                                 "length.")
            if not all(v >= 0 for v in self.rdp_values):  # NaN fails too
                raise ValueError(f"Release {self.name!r}: rdp_curve values must be >= 0 (inf allowed).")
        elif self.rdp_values is not None or self.rdp_orders is not None:
            raise ValueError(f"Release {self.name!r}: rdp_values and rdp_orders are for mechanism='rdp_curve' only.")
        elif self.mechanism == "exponential":
            if self.epsilon is None or self.epsilon <= 0:
                raise ValueError(f"Release {self.name!r}: the exponential mechanism needs epsilon > 0.")
        elif self.noise_multiplier is None or self.noise_multiplier <= 0:
            raise ValueError(f"Release {self.name!r}: {self.mechanism} needs noise_multiplier > 0.")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"Release {self.name!r}: sample_rate must be in (0, 1], got {self.sample_rate}.")
        if self.count < 0:
            raise ValueError(f"Release {self.name!r}: count must be >= 0.")

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """RDP curve of all ``count`` uses of this release (RDP composes additively: count × one use)."""
        if self.count == 0:
            return np.zeros(len(orders))
        if self.mechanism == "rdp_curve":
            if tuple(float(a) for a in orders) != self.rdp_orders:
                raise ValueError(f"Release {self.name!r} holds an RDP curve at other orders than the ledger's; "
                                 "compute the curve at the ledger's orders.")
            return self.count * np.asarray(self.rdp_values, dtype=float)
        return self.count * _unit_rdp(self.mechanism, self.noise_multiplier, self.sample_rate, self.epsilon,
                                      tuple(orders))

    def same_mechanism(self, other: Release) -> bool:
        """True when ``other`` is another use of exactly this mechanism (so counts can merge)."""
        keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "epsilon", "sample_rate", "delta",
                "rdp_values", "rdp_orders")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


class PrivacyLedger:
    """Composes every release of a run and enforces its (ε, δ) target.

    Args:
        target_epsilon: the run's total ε; releases beyond it are refused.
        delta: the run's total δ (conversion δ plus the additive δ of releases).
        accountant: ``"rdp"`` (default) or ``"prv"``; PRV (Gopi et al. 2021, via Opacus) is used
            where every release is a (subsampled) Gaussian, and the smaller of the two valid upper
            bounds is reported.
        adjacency: ``"add_remove"`` (default; what Opacus' DP-SGD accounting assumes) or
            ``"replace_one"`` (the DP-MERF paper's). Mechanisms read it to pick their sensitivity.
        orders: RDP orders.

    Raises:
        ValueError: on ε <= 0, δ outside (0, 1), or an unknown accountant/adjacency.
    """

    def __init__(
        self,
        *,
        target_epsilon: float,
        delta: float,
        accountant: str = "rdp",
        adjacency: str = "add_remove",
        orders: Sequence[float] = mech.DEFAULT_ORDERS,
    ) -> None:
        if not (isinstance(target_epsilon, int | float) and math.isfinite(target_epsilon) and target_epsilon > 0):
            raise ValueError(
                f"privacy.epsilon must be a finite number > 0, got {target_epsilon!r}. "
                "Set e.g. privacy.epsilon=1."
            )
        if not 0 < delta < 1:
            raise ValueError(
                f"privacy.delta must be in (0, 1), got {delta!r}. Use a δ well below 1/n, e.g. privacy.delta=1e-5."
            )
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"Unknown accountant {accountant!r}; valid: {', '.join(ACCOUNTANTS)}.")
        if adjacency not in ADJACENCIES:
            raise ValueError(f"Unknown adjacency {adjacency!r}; valid: {', '.join(ADJACENCIES)}.")
        self.target_epsilon = float(target_epsilon)
        self.delta = float(delta)
        self.accountant = accountant
        self.adjacency = adjacency
        self.orders = tuple(float(a) for a in orders)
        self.releases: list[Release] = []
        # uses of private rows outside any mechanism (name -> why): each voids the run's DP claim (:meth:`waive`)
        self.no_dp_claim: dict[str, str] = {}
        # budget held for releases planned for later (:meth:`reserve`): counted in every check, not in ``spent``
        self.reserved: list[Release] = []
        # durability (``durable`` and ``record``), in this order: ``commit()`` makes the file that holds the released
        # values a resumed run needs, with the ledger, as bytes in memory (a checkpoint: a ``Payload``; ``durable``
        # blocks only); ``register(ledger)``, or ``register(ledger, payload)``, charges the new state to the budget
        # registry (lightning_dp/budget/), checked against the run's claim on its data set's budget, and keeps the
        # payload's bytes in the same transaction; then the payload is written, then ``persist(ledger)`` writes the
        # ledger itself (ledger.json). See :meth:`_persist` for why no kill loses budget.
        self.register: Callable[..., None] | None = None
        self.persist: Callable[[PrivacyLedger], None] | None = None
        self.commit: Callable[[], Payload | None] | None = None
        # the run's id in the budget registry, and the registry's integrity tag of a state (``state_dict`` adds it)
        self.run_id: str | None = None
        self.seal: Callable[[dict[str, Any]], str] | None = None
        # name -> uses charged whose values no saved record holds and no payload in the registry covers (DP-SGD steps
        # after the last checkpoint, a checkpoint deleted after its run ended; ``lightning_dp.resume.registry_resume``):
        # they stay in ε, but :meth:`has` does not count them, so a one-shot release is drawn (and charged) again
        self.lost: dict[str, int] = {}
        self._open_blocks = 0
        self._epsilon_cache: dict[tuple, float] = {}  # (prv, releases) -> ε, for these orders and δ

    # ------------------------------------------------------------------ accounting
    def epsilon(self, releases: Sequence[Release] | None = None) -> float:
        """ε at the run's δ of ``releases`` (default: everything recorded so far)."""
        releases = self.releases if releases is None else list(releases)
        return self._epsilon(releases, prv=self.accountant == "prv")

    def _epsilon(self, releases: Sequence[Release], *, prv: bool) -> float:
        """ε of ``releases`` under RDP, or the smaller of the RDP and PRV bounds when ``prv`` applies.

        PRV is skipped (the RDP value returned) where RDP ε is huge: there PRV could not bring ε back to
        any useful target, and Opacus' PRV grid grows with the RDP ε (its domain is an RDP ε bound).
        Results are memoised: a DP-SGD step asks for the same spend several times (the check before the
        step, ``ledger.json``, the logged metric), and a PRV evaluation is expensive.
        """
        key = (prv, tuple((r.mechanism, r.sensitivity, r.noise_multiplier, r.epsilon, r.sample_rate, r.count, r.delta,
                           r.rdp_values, r.rdp_orders) for r in releases))
        cache = self._epsilon_cache
        if key not in cache:
            if len(cache) > 1024:
                cache.clear()
            cache[key] = self._compute_epsilon(releases, prv=prv)
        return cache[key]

    def _compute_epsilon(self, releases: Sequence[Release], *, prv: bool) -> float:
        if not any(r.count for r in releases):
            return 0.0
        delta_left = self.delta - sum(r.delta for r in releases if r.count)
        if delta_left <= 0:
            return math.inf
        rdp = np.sum([r.rdp(self.orders) for r in releases], axis=0)
        eps = mech.rdp_to_epsilon(self.orders, rdp, delta_left)
        if prv and _prv_applies(releases) and eps <= max(10 * self.target_epsilon, 50.0):
            eps = min(eps, self._prv_epsilon(releases, delta_left))
        return eps

    def _prv_epsilon(self, releases: Sequence[Release], delta: float) -> float:
        """PRV upper bound on ε (Gopi et al. 2021, via Opacus) on a grid of at most ``PRV_MAX_POINTS``.

        Opacus discretises on ``size = 2L / mesh`` points with L the safe domain (an RDP ε bound at
        δ_error/4, plus 3) and ``mesh = eps_error / sqrt(T·ln(12/δ_error)/2)`` for T composed steps, and
        keeps about a dozen float64 arrays of that size alive at once (grid, cell ends, CDF values and
        their temporaries in ``discretize``; cumulative sums in ``compute_epsilon``; one pmf per distinct
        release). Its default eps_error = 0.01 asks for gigabytes at a small noise multiplier, so we
        double eps_error until the grid fits: 2²⁰ points are 8 MiB per array, a peak of a few hundred MB
        at most. The result is Opacus' upper bound (estimate + eps_error), so a coarser grid only makes
        it looser, never invalid, and the ledger reports min(RDP, PRV).
        """
        from opacus.accountants import PRVAccountant
        from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV, compute_safe_domain_size

        history = [(r.noise_multiplier, r.sample_rate, r.count) for r in releases if r.count]
        prvs = [PoissonSubsampledGaussianPRV(q, sigma) for sigma, q, _ in history]
        counts = [count for _, _, count in history]
        delta_error = delta / 1000  # Opacus' default

        def grid_points(eps_error: float) -> float:  # as PRVAccountant._get_domain builds the grid
            domain = compute_safe_domain_size(prvs, counts, eps_error, delta_error)
            return 2 * domain * math.sqrt(sum(counts) * math.log(12 / delta_error) / 2) / eps_error

        eps_error = 0.01  # Opacus' default
        try:
            # Opacus' own RDP bound for the domain warns at small σ, its PRV of q = 1 takes log(0)
            with warnings.catch_warnings(), np.errstate(divide="ignore"):
                warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
                while grid_points(eps_error) > PRV_MAX_POINTS:
                    eps_error *= 2
                    if eps_error > 1.0:  # an upper bound this loose is no use next to RDP's
                        return math.inf
                acc = PRVAccountant()
                acc.history = history
                return float(acc.get_epsilon(delta, eps_error=eps_error, delta_error=delta_error))
        except Exception as err:  # PRV's discretisation fails for some extreme histories
            log.warning("PRV accountant failed (%s); reporting the RDP bound.", err)
            return math.inf

    @property
    def spent(self) -> float:
        """ε spent so far."""
        return self.epsilon()

    @property
    def remaining(self) -> float:
        """ε left before the target (0 when spent)."""
        return max(self.target_epsilon - self.spent, 0.0)

    def epsilon_if(self, planned: Sequence[Release]) -> float:
        """ε the run would reach after the ``planned`` releases, with the budget still reserved (:meth:`reserve`)."""
        return self.epsilon(self._merged(planned) + self._unreserved(planned))

    def _unreserved(self, planned: Sequence[Release]) -> list[Release]:
        """The reservations left once ``planned`` has used the ones it matches (same mechanism, count by count)."""
        left = list(self.reserved)
        for p in planned:
            for i, r in enumerate(left):
                if r.same_mechanism(p):
                    left[i] = replace(r, count=max(r.count - p.count, 0))
                    break
        return [r for r in left if r.count > 0]

    def reserve(self, releases: Sequence[Release]) -> None:
        """Hold budget for ``releases`` that come later in the run (e.g. the bias-mitigation weights after training).

        Every later check (``record``, ``epsilon_if``, ``calibrate``) counts the reservation as if it were
        spent, so a mechanism that calibrates to the target leaves room for it; ``spent`` does not include it.
        A recorded release that matches a reservation (same mechanism) uses it up, count by count. Nothing
        is released here, so reserving and :meth:`unreserve` are always safe.

        Raises:
            BudgetExceededError: the recorded releases and all reservations would exceed the target.
            ReleaseNotSavedError: the ledger could not be written.
        """
        reserved = [*self.reserved, *releases]
        eps = self.epsilon([*self.releases, *reserved])
        if eps > self.target_epsilon * (1 + 1e-9):
            raise BudgetExceededError(
                f"Reserving {', '.join(r.name for r in releases)} would take ε to {eps:.4g}, above the run's target "
                f"ε={self.target_epsilon:g} ({self.summary()}). Ask for less (e.g. a smaller weights.epsilon) or "
                "start a new run with a larger privacy.epsilon.")
        before, self.reserved = self.reserved, reserved
        try:
            self._persist()
        except BaseException:
            self.reserved = before
            raise

    def unreserve(self, prefix: str = "") -> None:
        """Drop the reservations whose name starts with ``prefix`` (all by default); nothing was released for them."""
        before = self.reserved
        self.reserved = [r for r in self.reserved if not r.name.startswith(prefix)]
        if self.reserved != before:
            try:
                self._persist()
            except BaseException:
                self.reserved = before
                raise

    def _merged(self, planned: Sequence[Release]) -> list[Release]:
        merged = list(self.releases)
        for p in planned:
            for i, r in enumerate(merged):
                if r.same_mechanism(p):
                    merged[i] = replace(r, count=r.count + p.count, last_at=p.last_at)
                    break
            else:
                merged.append(p)
        return merged

    # ------------------------------------------------------------------ the claim
    @property
    def dp_claim(self) -> bool:
        """True unless some part of the run used private rows outside a mechanism (:meth:`waive`)."""
        return not self.no_dp_claim

    def waive(self, name: str, note: str) -> None:
        """Record that ``name`` trains on private rows without a DP mechanism: the run makes no DP claim.

        The (ε, δ) of the recorded releases is still composed and enforced (the row count and the schema facts
        are DP), but it no longer bounds what the run's artefacts reveal, and every view of the ledger
        (``ledger.json``, :meth:`summary`, the audit report) says so. A waiver is never withdrawn: it is kept
        in the state, so a resumed run stays without a claim.

        Raises:
            ReleaseNotSavedError: the ledger could not be written; the run must not train.
        """
        before = dict(self.no_dp_claim)
        self.no_dp_claim[name] = note
        try:
            self._persist()
        except BaseException:
            self.no_dp_claim = before
            raise

    # ------------------------------------------------------------------ recording
    def has(self, name: str) -> bool:
        """True when a release named ``name`` has been recorded and its value saved: uses charged but ``lost`` (their
        value never reached a record on disk) do not count."""
        return sum(r.count for r in self.releases if r.name == name) > self.lost.get(name, 0)

    def record(self, release: Release) -> float:
        """Record ``release`` and return the new ε; refuses it when ε would exceed the target.

        Call this *before* the noisy value leaves the mechanism. Outside a :meth:`durable` block the
        ledger is persisted (``persist``) before this returns, so the ledger on disk is never behind a
        release whose noise is then used (DP-SGD's steps); inside a block, at the block's end.

        Raises:
            BudgetExceededError: the release would take ε above ``target_epsilon``.
            ReleaseNotSavedError: the ledger could not be written; the release is not recorded.
        """
        merged, reserved = self._merged([release]), self._unreserved([release])
        eps = self.epsilon(merged + reserved)
        if eps > self.target_epsilon * (1 + 1e-9):
            raise BudgetExceededError(
                f"Release {release.name!r} ({release.mechanism}, noise multiplier {release.noise_multiplier}, "
                f"count {release.count}) would raise ε from {self.spent:.4g} to {eps:.4g}, above the run's "
                f"target ε={self.target_epsilon:g} at δ={self.delta:g}. Nothing was released. To go on, "
                "increase the noise, plan fewer steps, or start a new run with a larger privacy.epsilon "
                "(a resumed run keeps the ε it has spent)."
            )
        before = (self.releases, self.reserved)
        self.releases, self.reserved = merged, reserved
        if not self._open_blocks:
            try:
                self._persist()
            except BaseException:
                self.releases, self.reserved = before
                raise
        return eps

    def _persist(self, *, commit: bool = False) -> None:
        """Make the ledger's state durable: (``commit``) the values as bytes, the registry's charge with those bytes, the
        values' file, then the ledger's file.

        Invariant: no file of the run is ever ahead of the budget registry, and every value the registry charges is
        either in the run's files or in the registry itself. ``commit()`` only serialises (nothing data-dependent
        reaches disk before the charge); ``register(ledger, payload)`` charges the state and stores the payload's bytes
        in one database transaction, so both or neither become durable; only then is the file written. Sound: a refusal
        (the data set's budget, a lost lease) leaves no file holding an uncharged value; a kill after the transaction
        leaves the charged values in the registry, and a resume writes those same bytes to their path
        (``lightning_dp.resume.restore_values``) instead of drawing the values again, so at most one draw of a release
        exists (on disk, in an orphaned temporary file, or in the registry) and it is charged once.

        Raises:
            ReleaseNotSavedError: the values or the ledger could not be written.
        """
        payload = None
        if commit and self.commit is not None:
            try:
                payload = self.commit()
            except OSError as err:
                raise ReleaseNotSavedError(
                    f"The released values could not be prepared for saving ({err}); nothing was released. Free disk "
                    "space or fix the output folder's permissions, then resume with resume=last.") from err
        if self.register is not None:  # refusals (the data set's budget, a lost lease) are UserErrors with their message
            if payload is None:
                self.register(self)
            else:
                self.register(self, payload)
        if payload is not None:
            try:
                payload.write()
            except OSError as err:
                raise ReleaseNotSavedError(
                    f"The released values could not be saved ({err}); nothing was released (the budget registry keeps "
                    "the charge and the values, which resume=last writes). Free disk space or fix the output folder's "
                    "permissions, then resume with resume=last.") from err
        if self.persist is None:
            return
        try:
            self.persist(self)
        except OSError as err:
            raise ReleaseNotSavedError(
                f"The privacy ledger could not be written ({err}); the release was refused and nothing was "
                "released. Free disk space or fix the output folder's permissions, then resume with resume=last."
            ) from err

    @contextlib.contextmanager
    def durable(self) -> Iterator[None]:
        """A block of releases that become durable together before anything computed from them leaves.

        Inside, ``record`` only checks and records in memory, and log records are held back. At the end,
        ``commit()`` serialises the released values with the ledger (e.g. a checkpoint of the module that now holds a
        noisy embedding), ``register`` charges the ledger to the budget registry together with those bytes, they are
        written, then ``persist`` writes the ledger, then the held logs are replayed (:meth:`_persist`). If anything
        fails, the block's releases are removed from this ledger again and its logs dropped: the noisy values existed
        only in memory and in the registry, so nothing left the run; a charge the registry already took stays, with
        the values a resume writes.

        Raises:
            ReleaseNotSavedError: the values or the ledger could not be written.
        """
        from lightning_dp.privacy.durable import held_logs

        snapshot, reserved = list(self.releases), list(self.reserved)
        self._open_blocks += 1
        try:
            with held_logs():
                try:
                    yield
                finally:
                    self._open_blocks -= 1
                if self._open_blocks == 0 and self.releases != snapshot:
                    self._persist(commit=True)
        except BaseException:
            self.releases, self.reserved = snapshot, reserved
            raise

    def calibrate(
        self,
        planned: Callable[[float], Sequence[Release]],
        *,
        epsilon: float | None = None,
        low: float = 1e-3,
        high: float = 1e5,
        rtol: float = 1e-4,
    ) -> float:
        """Smallest noise multiplier σ such that the recorded releases plus ``planned(σ)`` reach ε.

        Bisection in log σ. With the PRV accountant, RDP is searched first: it is a valid upper bound,
        so the RDP-calibrated σ_rdp already meets ε, and PRV is then searched only in
        [max(σ_rdp/4, 0.1), σ_rdp] (PRV saves well under a factor 4 in σ), never at the tiny σ where
        its grid explodes.

        Args:
            planned: builds the releases still to come from a candidate noise multiplier.
            epsilon: ε to reach (default: the target); a share of it when calibrating an auxiliary
                release on its own budget.
            low: smallest σ considered (returned when it already meets ε).
            high: largest σ considered.
            rtol: tolerance of the search in log σ.

        Raises:
            BudgetExceededError: even ``high`` noise would exceed ε (the budget is already spent).
        """
        goal = self.target_epsilon if epsilon is None else float(epsilon)
        if self.spent >= goal * (1 - 1e-3) or self.epsilon_if(planned(high)) > goal:
            raise BudgetExceededError(
                f"The privacy budget is already spent: ε={self.spent:.4g} of target {self.target_epsilon:g} "
                f"(δ={self.delta:g}), and the planned releases cannot fit in ε={goal:.4g} at any noise level. "
                "Start a new run with a larger privacy.epsilon, or release less."
            )

        def fits(sigma: float, prv: bool) -> bool:
            releases = planned(sigma)
            return self._epsilon(self._merged(releases) + self._unreserved(releases), prv=prv) <= goal

        use_prv = self.accountant == "prv" and _prv_applies(self._merged(planned(high)) + self.reserved)
        if not use_prv:
            return _smallest(lambda s: fits(s, False), low, high, rtol)
        if not fits(high, False):  # the recorded releases fit only under PRV: no RDP bracket
            return _smallest(lambda s: fits(s, True), low, high, rtol)
        sigma_rdp = _smallest(lambda s: fits(s, False), low, high, rtol)
        lower = max(low, min(sigma_rdp, max(sigma_rdp / 4, 0.1)))
        return _smallest(lambda s: fits(s, True), lower, sigma_rdp, rtol)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue composing after a restart; with the run's registry id and the registry's
        integrity tag (``integrity``) when the run has them."""
        state = {
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "orders": list(self.orders),
            "releases": [asdict(r) for r in self.releases],
            "reserved": [asdict(r) for r in self.reserved],
            "no_dp_claim": dict(self.no_dp_claim),
        }
        if self.lost:
            state["lost"] = dict(self.lost)
        if self.run_id is not None:
            state["run_id"] = self.run_id
        if self.seal is not None:
            state["integrity"] = self.seal(state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved ledger; its target and δ must match this run's (ε is never reset). The saved run id and
        integrity tag are not taken over: the caller checks them against the budget registry.

        Raises:
            ValueError: the saved ledger was for another (ε, δ), accountant or adjacency.
        """
        for key in ("target_epsilon", "delta", "accountant", "adjacency"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"The checkpoint's privacy ledger has {key}={state[key]!r} but this run asks for "
                    f"{getattr(self, key)!r}. A resumed run keeps its ledger: resume with the same "
                    "privacy settings, or start a new run (which spends a new budget on the data)."
                )
        self.orders = tuple(state["orders"])
        self._epsilon_cache = {}  # computed for the old orders
        self.releases = [Release(**r) for r in state["releases"]]
        self.reserved = [Release(**r) for r in state.get("reserved") or []]
        self.no_dp_claim = {**dict(state.get("no_dp_claim") or {}), **self.no_dp_claim}  # never withdrawn
        self.lost = {str(k): int(v) for k, v in (state.get("lost") or {}).items() if int(v) > 0}

    @staticmethod
    def most_advanced(states: Sequence[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
        """Of several records of one run's ledger (``(where, state)``), the one that shows the most releases.

        A resumed run must never go back to a record that shows less spend. The records must tell one story:
        each must be a prefix of the most advanced (the same releases, counts no larger).

        Raises:
            ValueError: the records disagree (a release, its parameters or the run's target differ): the
                run's files were changed by hand or belong to different runs.
        """
        def total(state: dict[str, Any]) -> int:
            return sum(int(r["count"]) for r in state["releases"])

        where, best = max(states, key=lambda ws: total(ws[1]))
        keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "epsilon", "sample_rate", "delta")
        for other_where, state in states:
            same_run = all(state[k] == best[k] for k in ("target_epsilon", "delta", "accountant", "adjacency"))
            covered = same_run and all(
                any(all(r[k] == b[k] for k in keys) and int(r["count"]) <= int(b["count"]) for b in best["releases"])
                for r in state["releases"])
            if not covered:
                raise ValueError(f"The ledger in {other_where} and the one in {where} do not describe the same run "
                                 "(a release or the target differs). The run's files were changed or mixed up: "
                                 "it cannot be resumed safely; start a new run.")
        waived = {k: v for _, state in states for k, v in (state.get("no_dp_claim") or {}).items()}
        return where, {**best, "no_dp_claim": waived}  # a waiver in any record stands (never withdrawn)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyLedger:
        """A ledger rebuilt from :meth:`state_dict`."""
        ledger = cls(
            target_epsilon=state["target_epsilon"],
            delta=state["delta"],
            accountant=state["accountant"],
            adjacency=state["adjacency"],
            orders=state["orders"],
        )
        ledger.load_state_dict(state)
        return ledger

    def to_dict(self) -> dict[str, Any]:
        """The JSON view: target, spend, and each release with its own ε and the running total."""
        rows, so_far = [], []
        for r in self.releases:
            so_far.append(r)
            rows.append(
                {
                    **asdict(r),
                    "epsilon_alone": self.epsilon([r]),
                    "epsilon_cumulative": self.epsilon(so_far),
                }
            )
        state = self.state_dict()  # the registry id and the tag, as in every other record
        return {
            **{k: state[k] for k in ("run_id", "integrity", "lost") if k in state},
            "dp_claim": self.dp_claim,
            "no_dp_claim": [{"name": k, "note": v} for k, v in self.no_dp_claim.items()],
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "epsilon": self.spent,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "delta_of_releases": sum(r.delta for r in self.releases),
            "orders": list(self.orders),
            "releases": rows,
            "reserved": [{**asdict(r), "epsilon_alone": self.epsilon([r])} for r in self.reserved],
            "epsilon_with_reserved": self.epsilon([*self.releases, *self.reserved]),
        }

    @staticmethod
    def state_from_json(d: dict[str, Any]) -> dict[str, Any]:
        """The ``state_dict`` inside a :meth:`to_dict` view (``ledger.json``)."""
        fields = {f.name for f in dataclasses.fields(Release)}
        return {**{k: d[k] for k in ("target_epsilon", "delta", "accountant", "adjacency")},
                "orders": list(d.get("orders", mech.DEFAULT_ORDERS)),
                "releases": [{k: v for k, v in r.items() if k in fields} for r in d["releases"]],
                "reserved": [{k: v for k, v in r.items() if k in fields} for r in d.get("reserved") or []],
                "no_dp_claim": {w["name"]: w["note"] for w in d.get("no_dp_claim") or []},
                **{k: d[k] for k in ("run_id", "integrity", "lost") if k in d}}

    def save_json(self, path: str) -> None:
        """Write :meth:`to_dict` to ``path`` atomically."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, default=float) + "\n")

    def summary(self) -> str:
        """One line for logs: ``ε = 0.98 of 1 (δ = 1e-05), 3 releases``."""
        text = f"ε = {self.spent:.4g} of {self.target_epsilon:g} (δ = {self.delta:g}), {len(self.releases)} releases"
        if self.reserved:
            text += (f" (ε = {self.epsilon([*self.releases, *self.reserved]):.4g} with the budget reserved for "
                     f"{', '.join(r.name for r in self.reserved)})")
        if self.no_dp_claim:
            text += f"; NO DP CLAIM for the run ({', '.join(self.no_dp_claim)} trained on private rows without DP)"
        return text
