"""Every network that reads private rows is covered by DP-SGD, or the run says it makes no DP claim.

A module names the networks whose training reads private rows (``exposed_networks``, from its config). Before
anything is released, :func:`check_coverage` compares them with the ``private_modules`` of the model's DP-SGD
mechanism. A network left over is either covered by the DP-SGD that ``privacy=dp_sgd`` adds
(:func:`complete_mechanisms`), or, where the user chose ``privacy=none`` (``require_dp: false``), recorded on
the ledger as a use of private rows without DP (:meth:`PrivacyLedger.waive`): the run then makes no DP claim
and every view of its ledger says so. With neither, the run is refused: a DP claim is never made for a network
that trains on rows without noise, and never dropped silently.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning_dp.errors import ConfigError
from lightning_dp.registry import resolve, to_plain

log = logging.getLogger(__name__)

DPSGD_TARGET = "lightning_dp.callbacks.dp_sgd.DPSGD"


def _sgd_nodes(model_cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in model_cfg.get("mechanisms") or [] if m.get("_target_") == DPSGD_TARGET]


def _declared(model_cfg: Any, what: str) -> list[str]:
    cfg = to_plain(model_cfg)
    module_cls = resolve(cfg["module"]["_target_"], expected="module", where="model.module")
    return list(getattr(module_cls, what)(cfg["module"])) if hasattr(module_cls, what) else []


def unprotected_networks(model_cfg: Any) -> list[str]:
    """Networks of ``model_cfg`` that read private rows outside any per-sample loss: DP-SGD cannot cover them."""
    return _declared(model_cfg, "unprotected_networks")


def uncovered_networks(model_cfg: Any) -> list[str]:
    """Networks of ``model_cfg`` that read private rows and that no DP-SGD mechanism in it covers."""
    covered = {name for node in _sgd_nodes(to_plain(model_cfg)) for name in node.get("private_modules", ["discriminator"])}
    return [name for name in _declared(model_cfg, "exposed_networks") if name not in covered]


def nominal_mechanisms(model_cfg: Any) -> list[tuple[str, str]]:
    """``(name, why)`` of each mechanism whose guarantee, with its settings, rests on an unproved bound
    (the class's ``nominal_guarantee(node)`` returns the reason, or None when its guarantee is proved)."""
    out = []
    for i, node in enumerate(to_plain(model_cfg).get("mechanisms") or []):
        cls = resolve(node["_target_"], expected="mechanism", where=f"model.mechanisms[{i}]")
        why = cls.nominal_guarantee(node) if hasattr(cls, "nominal_guarantee") else None
        if why:
            out.append((node["_target_"].rsplit(".", 1)[-1], why))
    return out


def check_coverage(cfg: Any) -> None:
    """Refuse, before any release, a DP run with a network that reads private rows without DP-SGD.

    Raises:
        ConfigError: a network is uncovered and neither ``privacy.dp_sgd`` nor ``privacy.require_dp: false`` is set,
            or ``privacy.dp_sgd`` is set beside a DP-SGD mechanism that leaves a network out.
    """
    name = cfg.model.get("name")
    nominal = nominal_mechanisms(cfg.model)
    if nominal and cfg.privacy.get("require_dp", True):
        raise ConfigError(f"model={name}: {nominal[0][1]}, so the run can make no DP claim. Change that setting, or "
                          "add privacy=none to run with a nominal guarantee (the ledger says the run makes no DP claim).")
    unprotected = unprotected_networks(cfg.model)
    if unprotected and (cfg.privacy.get("dp_sgd") or cfg.privacy.get("require_dp", True)):
        module_cfg = to_plain(cfg.model)["module"]
        module_cls = resolve(module_cfg["_target_"], expected="module", where="model.module")
        if hasattr(module_cls, "unprotected_reason"):  # the module's own reason and fix
            raise ConfigError(f"model={name} trains {', '.join(unprotected)} on private rows outside a per-sample "
                              f"loss, which DP-SGD cannot cover: {module_cls.unprotected_reason(module_cfg)}.")
        raise ConfigError(f"model={name} trains {', '.join(unprotected)} on private rows outside a per-sample loss, "
                          "which DP-SGD cannot cover (for PPEM: generator_condition=real). Use model.module."
                          "generator_condition=generated for a DP run, or privacy=none to train without a DP claim.")
    left = uncovered_networks(cfg.model)
    if not left:
        return
    if cfg.privacy.get("dp_sgd"):
        if _sgd_nodes(to_plain(cfg.model)):
            raise ConfigError(f"model={name}'s DP-SGD mechanism leaves {left} out; add them to its private_modules.")
        return
    if cfg.privacy.get("require_dp", True):
        raise ConfigError(f"model={name} trains {', '.join(left)} on private rows without DP-SGD. Add privacy=dp_sgd "
                          "for a DP run, or privacy=none to train without a DP claim (α-LMDP only; the ledger says so).")


def complete_mechanisms(cfg: Any, mechanisms: list[Any], *, ledger: Any, datamodule: Any,
                        noise_seed: int | None = None) -> list[Any]:
    """The run's mechanisms, with DP-SGD added for the uncovered networks (``privacy.dp_sgd``), or the
    uncovered networks recorded on the ledger as trained without DP (``privacy=none``).

    Call :func:`check_coverage` first (before any release); this runs just before training.

    Raises:
        ReleaseNotSavedError: the waiver could not be written (the run must not train).
    """
    from lightning_dp.callbacks.dp_sgd import DPSGD

    for name, why in nominal_mechanisms(cfg.model):
        ledger.waive(name, f"{why}: its (ε, δ) is nominal")
        log.warning("NO DP CLAIM: %s (privacy=none).", why)
    left = uncovered_networks(cfg.model)
    unprotected = unprotected_networks(cfg.model)
    if not left and not unprotected:
        return mechanisms
    sgd = to_plain(cfg.privacy.get("dp_sgd"))
    if sgd and left:
        log.info("privacy=dp_sgd: DP-SGD on %s, the networks of model=%s that read private rows.", left, cfg.model.name)
        return [*mechanisms, DPSGD(ledger=ledger, datamodule=datamodule, private_modules=left, noise_seed=noise_seed,
                                   **sgd)]
    left = left + unprotected
    note = (f"model={cfg.model.name} trains {', '.join(left)} on private rows without a DP mechanism (privacy=none): "
            "the synthetic data, checkpoint and logs are not DP releases")
    ledger.waive(f"{cfg.model.name}/{'+'.join(left)}", note)
    log.warning("NO DP CLAIM: %s. The run's (ε, δ) covers only its row count and schema releases.", note)
    return mechanisms
