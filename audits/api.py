"""``audit(synthetic, real, holdout, policy=...) -> Report``: the audit of ``python -m audits`` as an object.

The same steps as the command (:func:`audits.report.run_audit`): the policy is loaded, the inputs read with
:func:`audits.inputs.load_inputs`, the checks run by :func:`audits.report.build_report`. DataFrames are
written to a private temporary Parquet file first, so they go through the same readers as files. The report
is **private**: computed from ``real`` and ``holdout``, not differentially private; handle it like the data.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

IN_MEMORY = "pandas.DataFrame (in memory)"


@dataclass
class Report:
    """An audit's result: the verdict, each check and each threshold's decision, and the figures.

    Attributes:
        data: the report as ``report.json`` holds it (``privacy`` label first, then ``status``, ``verdicts``,
            ``checks``, ``summary``, ``warnings``, inputs, ledger, versions).
        figures: per check, its matplotlib figures (drawn into :meth:`to_html`).
    """

    data: dict[str, Any]
    figures: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def verdict(self) -> str:
        """``pass``, ``fail`` or ``inconclusive`` (the data could not decide a threshold)."""
        return self.data["status"]

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def reason(self) -> str:
        return self.data["status_reason"]

    @property
    def checks(self) -> dict[str, dict[str, Any]]:
        """Each check's numbers by name (``membership``, ``utility``, ...), with ``status`` and ``role``."""
        return self.data["checks"]

    @property
    def verdicts(self) -> list[dict[str, Any]]:
        """Each threshold's decision: ``check``, ``description``, ``value``, ``interval``, ``limit``, ``status``."""
        return self.data["verdicts"]

    @property
    def summary(self) -> list[str]:
        """One line per check, as ``python -m audits`` prints them."""
        return self.data["summary"]

    @property
    def warnings(self) -> list[str]:
        return self.data["warnings"]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe report (``report.json``)."""
        return self.data

    def to_html(self) -> str:
        """The self-contained ``report.html`` (figures inline), labelled private at its top."""
        from audits.html import render_html

        return render_html(self.data, self.figures)

    def save(self, out: str | Path) -> dict[str, str]:
        """Write ``report.json`` and ``report.html`` into the folder ``out`` (both or neither).

        Returns:
            ``{"html": path, "json": path}``.
        """
        from audits.output import check_output_folder
        from audits.report import write_report

        check_output_folder(out)
        return write_report(self.data, self.figures, out)

    def __str__(self) -> str:
        return "\n".join([*self.summary, f"verdict: {self.verdict.upper()} ({self.reason})"])

    def _repr_html_(self) -> str:  # a notebook shows the report itself
        return self.to_html()


def audit(synthetic: pd.DataFrame | str | Path | Any, real: pd.DataFrame | str | Path,
          holdout: pd.DataFrame | str | Path, *, policy: str | Path | Mapping[str, Any] | None = None,
          seed: int | None = None, label: str | None = None, num_rows: int | None = None,
          data_root: str | None = None, out: str | Path | None = None) -> Report:
    """Audit synthetic rows against the real training rows and rows never trained on.

    Args:
        synthetic: a DataFrame (a ``weight`` column is read as importance weights), a ``.csv``/``.parquet`` file, a
            checkpoint (sampled; its ledger goes into the report) or a fitted :class:`lightning_dp.Synthesizer`
            (its checkpoint).
        real: the private training rows: a DataFrame, a file, or a data set name (``adult``: the run's own split).
        holdout: real rows never trained on, in the same forms.
        policy: a policy YAML path, a policy mapping (``{"checks": {...}}``), or None for
            ``audits/policies/default.yaml``.
        seed: seed of sampling, candidates and attacks (default: the policy's).
        label: the label column for utility (default: the schema's, when a checkpoint gives one).
        num_rows: rows sampled from a checkpoint (default: as many as ``real``).
        data_root: folder of the shared data sets, for data set names.
        out: also write ``report.json`` and ``report.html`` there.

    Returns:
        The :class:`Report` (private: computed from ``real`` and ``holdout``, not DP).

    Raises:
        PolicyError, InputError, CheckpointError, ValueError: bad input (nothing is written).
    """
    import pandas as pd

    from audits.inputs import load_inputs
    from audits.output import check_output_folder
    from audits.policy import load_policy
    from audits.report import build_report, write_report
    from lightning_dp.progress import tracker

    pol = load_policy(policy)  # first: a bad policy fails before any data are read
    if out is not None:
        check_output_folder(out)
    if hasattr(synthetic, "checkpoint") and hasattr(synthetic, "sample"):  # a Synthesizer
        if synthetic.checkpoint is None:
            from audits.inputs import InputError

            raise InputError("The Synthesizer is not fitted: call fit(...) before auditing it.")
        synthetic = synthetic.checkpoint
    seed = pol["seed"] if seed is None else seed
    in_memory = {}
    with tracker.session(), tempfile.TemporaryDirectory(prefix="lightning-dp-audit-") as tmp:
        tracker.stage("audit: read inputs")
        Path(tmp).chmod(0o700)  # private rows: owner-only, removed when the audit returns
        args = {}
        for what, value in (("synthetic", synthetic), ("real", real), ("holdout", holdout)):
            if isinstance(value, pd.DataFrame):
                path = Path(tmp) / f"{what}.parquet"
                value.to_parquet(path, index=False)
                args[what], in_memory[what] = str(path), True
            else:
                args[what] = str(value)
        inputs = load_inputs(args["synthetic"], real=args["real"], holdout=args["holdout"], num_rows=num_rows,
                             seed=seed, data_root=data_root, label=label)
        for what in in_memory:  # the temporary file goes: name what it was
            inputs.sources[what]["path"] = IN_MEMORY
        report, figures = build_report(inputs, pol, seed=seed)
        if out is not None:
            tracker.stage("audit: write report.json and report.html")
            write_report(report, figures, out)
    return Report(report, figures)
