"""MegatronModel's activation checkpointing (`gradient_checkpointing=`, over global layer indices) trains exactly
like the plain run: the same losses, gradient norms and log-probs after 3 steps (1e-6, fp32) -- LoRA on
padding-free batches on one rank, and full-parameter under tp=2 with sequence parallelism (recomputation repeats
the tensor-parallel collectives). Mesh dimensions Megatron does not implement are refused by the shared check."""

from __future__ import annotations

import pytest

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceMesh

TOL = 1e-6


def assert_same_as_plain(got: dict, want: dict) -> None:
    assert got['losses'] == pytest.approx(want['losses'], abs=TOL)
    assert got['grad_norms'] == pytest.approx(want['grad_norms'], rel=TOL)
    for g, w in zip(got['after']['logprobs'], want['after']['logprobs']):
        assert g == pytest.approx(w, abs=TOL)


@pytest.mark.parametrize(
    'policy,layers', [('true', [0, 1, 2, 3]), ('2', [0, 2]), ('"selective"', [0, 1, 2, 3])], ids=['all', 'k2', 'sel']
)
def test_lora_padding_free_checkpointed_equals_plain(megatron_run, peft_adapter_dir, policy, layers) -> None:
    plain = megatron_run(1, '--adapter', peft_adapter_dir, '--packed')
    checkpointed = megatron_run(1, '--adapter', peft_adapter_dir, '--packed', '--gradient-checkpointing', policy)
    assert plain['checkpointed_layers'] == [] and checkpointed['checkpointed_layers'] == layers
    assert_same_as_plain(checkpointed, plain)


def test_tp2_sequence_parallel_checkpointed_equals_plain(megatron_run) -> None:
    plain = megatron_run(2, '--tp', 2, '--sp')
    checkpointed = megatron_run(2, '--tp', 2, '--sp', '--gradient-checkpointing', 'true')
    assert checkpointed['checkpointed_layers'] == [0, 1, 2, 3]
    assert_same_as_plain(checkpointed, plain)


def test_fsdp_and_cp_are_refused_naming_megatron(tiny_model_dir) -> None:
    from twinkle_megatron.model import MegatronModel

    mesh = DeviceMesh.from_sizes(device_type='cpu', cp_size=2)
    refusal = r'cp_size=2 \(context / sequence parallel\) is not implemented by MegatronModel'
    with pytest.raises(MeshError, match=refusal):
        MegatronModel(tiny_model_dir, device_mesh=mesh)
