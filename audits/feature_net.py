"""A small conv network whose penultimate layer is the feature space for offline FID/KID.

PEARL (§3.4) computes FID/KID on the 84-d tanh features of a LeNet trained on MNIST; Inception weights are a
download that this project cannot rely on. :class:`FeatureNet` plays the LeNet role: two conv layers, a
``tanh`` feature layer (default 64-d) and a linear classifier head, for 1-channel square images of any size
(8x8 digits, 28x28 MNIST). Its ``forward`` follows torchmetrics' custom-extractor convention: it takes the
batch the metric is given (uint8 in [0, 255] when ``normalize=False``, float in [0, 1] when
``normalize=True``; ``(N, H, W)``, ``(N, 1, H, W)`` or ``(N, 3, H, W)``) and returns ``(N, num_features)``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)


def as_image_batch(images: Tensor | np.ndarray) -> Tensor:
    """Bring images to float32 ``(N, 1, H, W)`` in [0, 1].

    Args:
        images: integer images in [0, 255] or float images in [0, 1]; shape ``(N, H, W)``, ``(N, C, H, W)``
            with C in {1, 3} (RGB is averaged to grey), or ``(N, H*W)`` for square images.

    Returns:
        The float32 batch ``(N, 1, H, W)``.

    Raises:
        ValueError: for a shape that is none of the above.
    """
    x = images if isinstance(images, Tensor) else torch.tensor(np.asarray(images))  # copies read-only arrays
    x = x.float() / 255.0 if not torch.is_floating_point(x) else x.float()
    if x.dim() == 2:  # (N, H*W), flattened square images
        side = int(round(x.size(1) ** 0.5))
        if side * side != x.size(1):
            raise ValueError(f"flat images of {x.size(1)} pixels are not square; pass (N, H, W)")
        x = x.reshape(x.size(0), side, side)  # (N, H, W)
    if x.dim() == 3:
        x = x.unsqueeze(1)  # (N, 1, H, W)
    if x.dim() != 4 or x.size(1) not in (1, 3):
        raise ValueError(
            f"expected (N, H, W), (N, 1, H, W) or (N, 3, H, W) images, got shape {tuple(x.shape)}"
        )
    if x.size(1) == 3:
        x = x.mean(dim=1, keepdim=True)  # (N, 1, H, W)
    return x


class FeatureNet(nn.Module):
    """Conv feature extractor plus classifier head (the FID/KID feature space is ``tanh(fc)``).

    Args:
        num_classes: classes of the head.
        num_features: feature dimension (what torchmetrics reads as ``num_features``).
        channels: channels of the two conv layers.
        pool: side of the adaptive average pool before the feature layer (any input size maps to it).
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        num_features: int = 64,
        channels: tuple[int, int] = (16, 32),
        pool: int = 4,
    ) -> None:
        super().__init__()
        self.config = {
            "num_classes": num_classes,
            "num_features": num_features,
            "channels": list(channels),
            "pool": pool,
        }
        self.num_features = (
            num_features  # torchmetrics uses this instead of probing with a (1, 3, 299, 299) dummy
        )
        self.body = nn.Sequential(
            nn.Conv2d(1, channels[0], kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(channels[0], channels[1], kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(pool),
            nn.Flatten(),
        )
        self.fc = nn.Linear(channels[1] * pool * pool, num_features)
        self.head = nn.Linear(num_features, num_classes)

    def features(self, images: Tensor) -> Tensor:
        """Penultimate features ``(N, num_features)`` of a batch in any :func:`as_image_batch` format."""
        x = as_image_batch(images).to(self.fc.weight.device)  # (N, 1, H, W)
        return torch.tanh(self.fc(self.body(x)))  # (N, F)

    def forward(self, images: Tensor) -> Tensor:
        """The features; this is what ``FrechetInceptionDistance(feature=net)`` calls."""
        return self.features(images)

    def logits(self, images: Tensor) -> Tensor:
        """Class logits ``(N, num_classes)``."""
        return self.head(self.features(images))


def _batches(n: int, batch_size: int, generator: torch.Generator | None = None) -> list[Tensor]:
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    return list(order.split(batch_size))


@torch.no_grad()
def predict(net: FeatureNet, images: Tensor | np.ndarray, *, batch_size: int = 1024) -> np.ndarray:
    """Predicted class indices of ``images``."""
    net.eval()
    x = as_image_batch(images)
    return torch.cat([net.logits(x[idx]).argmax(1) for idx in _batches(len(x), batch_size)]).numpy()


def accuracy(net: FeatureNet, images: Tensor | np.ndarray, labels: np.ndarray) -> float:
    """Fraction of ``images`` whose predicted class equals ``labels``."""
    return float(np.mean(predict(net, images) == np.asarray(labels)))


def train_feature_net(
    images: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    epochs: int = 5,
    seed: int = 0,
    batch_size: int = 128,
    lr: float = 2e-3,
    num_features: int = 64,
    num_classes: int | None = None,
) -> FeatureNet:
    """Train a :class:`FeatureNet` classifier with Adam and cross-entropy (plain torch loop, CPU).

    Args:
        images: training images in any :func:`as_image_batch` format.
        labels: integer class labels in ``[0, num_classes)``.
        epochs: passes over the data.
        seed: seed of initialisation and shuffling (the global torch RNG is left untouched).
        batch_size: minibatch size.
        lr: Adam learning rate.
        num_features: feature dimension.
        num_classes: head size; default ``max(labels) + 1``.

    Returns:
        The trained net in eval mode with gradients switched off.

    Raises:
        ValueError: for labels that are not non-negative integers or do not match the images.
    """
    x = as_image_batch(images)  # (N, 1, H, W)
    y = torch.tensor(np.asarray(labels, dtype=np.int64))
    if len(y) != len(x) or (y < 0).any():
        raise ValueError("labels must be non-negative integers, one per image")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = FeatureNet(num_classes or int(y.max()) + 1, num_features=num_features)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    for epoch in range(epochs):
        total = 0.0
        for idx in _batches(len(x), batch_size, generator):
            loss = nn.functional.cross_entropy(net.logits(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        logger.debug("feature net epoch %d: train/loss %.4f", epoch, total / len(x))
    return net.eval().requires_grad_(False)


def save_feature_net(net: FeatureNet, path: str | Path) -> None:
    """Save config and weights so :func:`load_feature_net` can rebuild the net."""
    torch.save({"config": net.config, "state_dict": net.state_dict()}, Path(path))


def load_feature_net(path: str | Path) -> FeatureNet:
    """Load a :class:`FeatureNet` saved by :func:`save_feature_net` (or a bare state dict of one).

    Raises:
        ValueError: if the file holds weights of another architecture.
    """
    blob: dict[str, Any] = torch.load(Path(path), map_location="cpu", weights_only=True)
    state = blob.get("state_dict", blob)
    config = dict(blob.get("config", {}))
    if not config:
        try:
            config = {
                "num_classes": state["head.weight"].shape[0],
                "num_features": state["fc.weight"].shape[0],
            }
            config["channels"] = [state["body.0.weight"].shape[0], state["body.3.weight"].shape[0]]
            config["pool"] = int(round((state["fc.weight"].shape[1] / config["channels"][1]) ** 0.5))
        except KeyError as err:
            raise ValueError(f"{path} does not hold FeatureNet weights (missing {err})") from err
    net = FeatureNet(
        config["num_classes"],
        num_features=config["num_features"],
        channels=tuple(config["channels"]),
        pool=config["pool"],
    )
    net.load_state_dict(state)
    return net.eval().requires_grad_(False)
