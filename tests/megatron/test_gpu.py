"""MegatronModel on a CUDA GPU (NCCL, bf16 by default, no CPU bridge): the same training run as
TransformersModel on the same GPU. bf16 rounds differently in the two backends' kernels, so the tolerance is the
bf16 one (losses 5e-2); the CPU tests hold the fp32 equality to 1e-5."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')]


def test_single_gpu_trains_like_transformers_model(megatron_run) -> None:
    reference = megatron_run(1, '--backend', 'TransformersModel')
    result = megatron_run(1)
    assert result['losses'] == pytest.approx(reference['losses'], abs=5e-2)
    assert result['after']['loss'] == pytest.approx(reference['after']['loss'], abs=5e-2)


def test_no_cpu_bridge_is_installed_on_a_gpu_machine() -> None:
    from twinkle_megatron import cpu_compat
    assert cpu_compat.apply() is False and cpu_compat.applied() == []
