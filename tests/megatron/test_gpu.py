"""MegatronModel on a CUDA GPU (NCCL, bf16 by default, no CPU bridge): the same training runs as
TransformersModel on the same GPU. bf16 rounds differently in the two backends' kernels, so the tolerance is the
bf16 one (losses 5e-2); the CPU tests hold the fp32 equality to 1e-5. One GPU: layouts of several ranks (tp, pp,
dp) are tested on CPU/gloo; NCCL cannot put two ranks on one device."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')]

BF16 = 5e-2


def assert_close_runs(result: dict, reference: dict) -> None:
    assert result['losses'] == pytest.approx(reference['losses'], abs=BF16)
    assert result['after']['loss'] == pytest.approx(reference['after']['loss'], abs=BF16)
    assert result['losses'][-1] < result['losses'][0]  # it learns


def test_single_gpu_trains_like_transformers_model(megatron_run) -> None:
    assert_close_runs(megatron_run(1), megatron_run(1, '--backend', 'TransformersModel'))


def test_padding_free_single_gpu_trains_like_transformers_model(megatron_run) -> None:
    assert_close_runs(megatron_run(1, '--packed'), megatron_run(1, '--backend', 'TransformersModel', '--packed'))


def test_lora_single_gpu_trains_like_peft_lora(megatron_run, peft_adapter_dir) -> None:
    reference = megatron_run(1, '--backend', 'TransformersModel', '--adapter', peft_adapter_dir)
    result = megatron_run(1, '--adapter', peft_adapter_dir)
    assert_close_runs(result, reference)
    assert result['checkpoint']


def test_a_second_adapter_beside_changes_nothing_of_the_first_on_a_gpu(megatron_run, peft_adapter_dir) -> None:
    alone = megatron_run(1, '--adapter', peft_adapter_dir)
    beside = megatron_run(1, '--adapter', peft_adapter_dir, '--neighbour')
    # the same run up to GPU non-determinism (atomics in attention backward), far below what a leak moves
    assert beside['losses'] == pytest.approx(alone['losses'], abs=5e-3)
    assert beside['after']['loss'] == pytest.approx(alone['after']['loss'], abs=5e-3)


def test_no_cpu_bridge_is_installed_on_a_gpu_machine() -> None:
    from twinkle_megatron import cpu_compat

    assert cpu_compat.apply() is False and cpu_compat.applied() == []
