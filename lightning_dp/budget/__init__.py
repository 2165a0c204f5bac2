"""One privacy budget per data set, across all its runs, kept in a database (SQLite by default, PostgreSQL for teams).

``registry.py`` holds the budget decisions (claims, records, leases, integrity tags), ``run.py`` a run's session with
it, ``lock.py`` the run folder's lock, ``__main__.py`` the command line (``python -m lightning_dp.budget``).
"""

from lightning_dp.budget.registry import (
    DatasetBudgetError,
    Registry,
    RegistryError,
    RunBusyError,
    TamperedError,
    resolve_url,
)
from lightning_dp.budget.run import RunBudget, in_tuning, throwaway_registry, tuning_candidates

__all__ = ["DatasetBudgetError", "Registry", "RegistryError", "RunBudget", "RunBusyError", "TamperedError",
           "in_tuning", "resolve_url", "throwaway_registry",
           "tuning_candidates"]
