"""What every generator shares: sampling in model space from released label proportions."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import torch
from pytorch_lightning import LightningModule
from torch import Tensor

from lightning_dp.privacy.batch_terms import batch_terms
from lightning_dp.privacy.metrics import check_declared, declared_metrics


class GeneratorModule(LightningModule):
    """A LightningModule that can ``sample(n, labels=None)`` rows ``(x, y)`` in model space.

    Subclasses set ``self.generator`` (an ``nn.Module`` taking ``(z, y)``) and keep the released label
    proportions in the ``class_probs`` buffer (uniform until a DP release sets them). The data module's
    encoder turns the samples into the user's columns.
    """

    generator: torch.nn.Module
    # metric key -> why it is public or DP; nothing else can be logged (lightning_dp/privacy/metrics.py)
    public_metrics: ClassVar[dict[str, str]] = {}
    # True: the model needs table rows; image data is refused before any release (``models.check_data``)
    tabular_only: ClassVar[bool] = False
    # What a later release added, so that a run saved before resumes (``resume.py``) and samples (``load_run``):
    # settings (``__init__`` parameters; a registered network or mechanism may name its own the same way), each with
    # the default that does what the class did before it, taken where a saved config lacks it
    # (``models.fill_settings_added_later``); and groups of state entries (buffers) added at once, which a checkpoint
    # written before lacks whole: they keep the module's initial values, which must likewise do what it did (GEM's
    # label head: not fitted, the generator's own label is sampled). A checkpoint with part of a group is refused.
    settings_added_later: ClassVar[tuple[str, ...]] = ()
    state_added_later: ClassVar[tuple[tuple[str, ...], ...]] = ()

    @classmethod
    def absent_later_state(cls, keys: Collection[str], prefix: str = "") -> set[str]:
        """The entries of :attr:`state_added_later` that a checkpoint holding ``keys`` may lack: every entry of each
        group of which it holds none (it was written before the group was added), with ``prefix``."""
        return {prefix + name for group in cls.state_added_later if not any(prefix + n in keys for n in group)
                for name in group}

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """``LightningModule.log`` for declared keys only, never weighted by a (private) batch size."""
        check_declared(name, declared_metrics(self))
        kwargs["batch_size"] = 1
        super().log(name, value, *args, **kwargs)

    @staticmethod
    def exposed_networks(module_cfg: Mapping[str, Any]) -> list[str]:
        """Attribute names of the networks whose training reads private rows, for a module config.

        A DP run must cover each with DP-SGD (its ``private_modules``); ``privacy/coverage.py`` refuses a run
        that does not, before anything is released, unless the user waives the DP claim (``privacy=none``).
        Modules that see data only through one-shot releases (DP-MERF, PEARL) read none in training.
        """
        return []

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """A per-sample loss (shape (B,)) without a DP mechanism: its mean plus the registered batch terms.

        DP-SGD replaces this hook with its private backward; this is the plain, non-private path.
        """
        if loss.dim() == 1:
            if loss.numel() == 0:
                return
            total = loss.mean()
            for term in batch_terms(self):
                value = term(loss)
                if value is not None:
                    total = total + value
            loss = total
        super().backward(loss, *args, **kwargs)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        """A checkpoint written before a group of :attr:`state_added_later` existed loads strictly (``load_run``,
        Lightning's restore on resume): the group's entries keep their initial values."""
        before = len(missing_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        absent = self.absent_later_state(state_dict.keys(), prefix)
        missing_keys[before:] = [k for k in missing_keys[before:] if k not in absent]

    def init_label_buffer(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.register_buffer("class_probs", torch.full((num_classes,), 1.0 / num_classes))

    def sample_labels(self, n: int, *, generator: torch.Generator | None = None) -> Tensor:
        """Labels drawn from the released class proportions."""
        return torch.multinomial(self.class_probs.cpu(), n, replacement=True, generator=generator).to(self.device)

    @torch.no_grad()
    def sample(self, n: int, labels: Tensor | None = None, *, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """``n`` synthetic rows ``(x, y)``; one-hot blocks are sampled (hard), not probabilities.

        With ``seed`` every random draw (labels, latent noise, categories) is reproducible; the global
        random state outside this call is left as it was.
        """
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            if seed is not None:
                torch.manual_seed(seed)
            was_training = self.training
            self.eval()
            try:
                return self._sample(n, labels)
            finally:
                self.train(was_training)

    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        y = self.sample_labels(n) if labels is None else labels.to(self.device)
        z = torch.randn(n, self.generator.latent_dim, device=self.device)
        return self.generator(z, y, hard=True), y
