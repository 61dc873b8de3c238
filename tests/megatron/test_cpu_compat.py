"""The CPU bridges for megatron-core: scoped to the listed megatron modules and to `tensors_as_cuda` blocks, and
inert on a CUDA machine."""

from __future__ import annotations

import importlib

import pytest
import torch

from twinkle_megatron import cpu_compat


@pytest.mark.skipif(torch.cuda.is_available(), reason='the bridges exist for machines without CUDA')
def test_bridges_patch_only_the_listed_megatron_modules() -> None:
    assert cpu_compat.apply() is True
    assert cpu_compat.applied() == list(cpu_compat.MODULES)
    utils = importlib.import_module('megatron.core.transformer.utils')
    assert utils.torch is not torch and utils.torch.cuda.current_device() == 'cpu'
    assert utils.torch.zeros(2, device='cuda').device.type == 'cpu'  # the literal device="cuda" of megatron
    assert utils.get_default_causal_mask(3).tolist() == [[False, True, True], [False, False, True], [False] * 3]
    assert utils.torch.float32 is torch.float32 and utils.torch.Tensor is torch.Tensor  # everything else: torch
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.current_device()  # torch itself is untouched


@pytest.mark.skipif(torch.cuda.is_available(), reason='the bridges exist for machines without CUDA')
def test_tensors_as_cuda_is_scoped_to_the_block() -> None:
    t = torch.zeros(2)
    with cpu_compat.tensors_as_cuda():
        assert t.type() == 'torch.cuda.FloatTensor' and t.cuda() is t
        assert t.type(torch.float64).dtype == torch.float64  # a cast still casts
    assert t.type() == 'torch.FloatTensor'
    with pytest.raises((AssertionError, RuntimeError)):
        t.cuda()


def test_nothing_is_bridged_on_a_cuda_machine(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert cpu_compat.apply() is False
    original = torch.Tensor.type
    with cpu_compat.tensors_as_cuda():
        assert torch.Tensor.type is original
