"""The release statistics keep every tensor on the rows' device.

A CUDA run streams its private rows on the GPU; a statistic that mixes in a CPU tensor fails there only
(the H200 check of stop 32 found DP-MERF's and PEARL's bandwidth moments doing so). The ``meta`` device
catches the same mistake on a CPU-only machine: an op mixing a meta and a CPU tensor raises.
"""

from __future__ import annotations

import torch

from lightning_dp.privacy.statistics import class_feature_sums, moment_sums

META = torch.device("meta")


def test_moment_sums_stays_on_the_rows_device() -> None:
    rows = [torch.empty(5, 3, device=META), torch.empty(2, 3, device=META)]
    assert moment_sums(rows).device == META


def test_class_feature_sums_stays_on_the_features_device() -> None:
    batches = [(torch.empty(4, 3, device=META), torch.zeros(4, dtype=torch.long, device=META))]
    sums, counts = class_feature_sums(batches, lambda x: x * 2.0, 2)
    assert sums.device == META and counts.device == META


def test_moment_sums_values_on_cpu() -> None:
    x = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    acc = moment_sums([x[:1], x[1:]])
    assert acc.tolist() == [1.0, 2.0, 3.0, 2.0]
