"""MegatronModel equals TransformersModel on the same tiny model and data (real gloo process groups, 2 ranks; 4
for the slow combined layouts): log-probs before training, the loss of each of 3 optimizer steps, the gradient
norms, the log-probs after training, and the saved checkpoint reloaded into TransformersModel.

Tolerances (fp32): losses 1e-5 absolute; log-probs 1e-5 absolute or relative, whichever is larger (Megatron sums
tensor- and data-parallel partial products in another order: ~1e-6 differences, which Adam turns into slightly
larger ones on parameters with near-zero gradients; the largest measured after 3 steps is 1.2e-5 on a log-prob
of -6.79, 1.8e-6 relative); gradient norms 5e-5 relative (a norm of ~5 over 3M parameters)."""

from __future__ import annotations

import pytest

TOL = 1e-5
NORM_REL = 5e-5

LAYOUTS = {
    'tp2': (2, ('--tp', 2)),
    'pp2': (2, ('--pp', 2)),
    'tp2_sp': (2, ('--tp', 2, '--sp')),
    'dp2_distributed_optimizer': (2, ('--distributed-optimizer',)),
    'pp2_vpp2': (2, ('--pp', 2, '--vpp', 2)),
    'pp2_three_micro_batches': (2, ('--pp', 2, '--micro-batch-size', 3)),
    'tp2_sp_padding_free': (2, ('--tp', 2, '--sp', '--packed')),
}
SLOW_LAYOUTS = {
    # regional compilation traced by AOTAutograd (no code generation on CPU): same numbers as eager
    'compiled_layers': (1, ('--compile-layers', 'aot_eager')),
    'tp2_pp2': (4, ('--tp', 2, '--pp', 2)),
    'tp2_sp_dp2_distributed_optimizer': (4, ('--tp', 2, '--sp', '--distributed-optimizer')),
}


def assert_same_logprobs(got: list[list[float]], want: list[list[float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=TOL, rel=TOL)


def assert_same_run(got: dict, want: dict) -> None:
    assert_same_logprobs(got['before']['logprobs'], want['before']['logprobs'])
    assert got['losses'] == pytest.approx(want['losses'], abs=TOL)
    assert got['grad_norms'] == pytest.approx(want['grad_norms'], rel=NORM_REL)
    assert_same_logprobs(got['after']['logprobs'], want['after']['logprobs'])
    assert got['after']['loss'] == pytest.approx(want['after']['loss'], abs=TOL)
    moved = max(abs(a - b) for x, y in zip(got['after']['logprobs'], got['before']['logprobs']) for a, b in zip(x, y))
    assert moved > 1e-2  # it trained


def assert_checkpoint_reloads(result: dict, tiny_model_dir) -> None:
    """The checkpoint (HF or PEFT format) loads in TransformersModel and scores as the Megatron model did."""
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(tiny_model_dir)
    model.load(result['checkpoint'])
    assert_same_logprobs(model.forward_only(inputs=result['eval_rows'])['logprobs'], result['after']['logprobs'])


def check_layout(megatron_run, tiny_model_dir, nproc: int, args: tuple) -> None:
    reference = megatron_run(1, '--backend', 'TransformersModel')
    result = megatron_run(nproc, *args)
    assert result['world_size'] == nproc
    assert result['compile_backend'] == (args[1] if '--compile-layers' in args else None)
    assert_same_run(result, reference)
    assert_checkpoint_reloads(result, tiny_model_dir)


@pytest.mark.parametrize('layout', sorted(LAYOUTS))
def test_layout_trains_like_transformers_model(megatron_run, tiny_model_dir, layout) -> None:
    check_layout(megatron_run, tiny_model_dir, *LAYOUTS[layout])


@pytest.mark.slow
@pytest.mark.parametrize('layout', sorted(SLOW_LAYOUTS))
def test_slow_layout_trains_like_transformers_model(megatron_run, tiny_model_dir, layout) -> None:
    check_layout(megatron_run, tiny_model_dir, *SLOW_LAYOUTS[layout])


def test_single_process_trains_like_transformers_model(megatron_run, tiny_model_dir) -> None:
    check_layout(megatron_run, tiny_model_dir, 1, ())


def test_lora_under_tp2_trains_like_peft_lora(megatron_run, tiny_model_dir, peft_adapter_dir) -> None:
    """Both start from the same PEFT adapter (random A and B); the Megatron checkpoint is a PEFT adapter; removing
    the adapter gives back the base model."""
    reference = megatron_run(1, '--backend', 'TransformersModel', '--adapter', peft_adapter_dir)
    result = megatron_run(2, '--tp', 2, '--adapter', peft_adapter_dir)
    assert_same_run(result, reference)
    assert_checkpoint_reloads(result, tiny_model_dir)
    base = megatron_run(1, '--backend', 'TransformersModel')['before']['logprobs']
    assert_same_logprobs(result['base_after_remove'], base)
    import peft
    from transformers import AutoModelForCausalLM

    peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), result['checkpoint'])


def test_a_second_adapter_beside_changes_nothing_of_the_first(megatron_run, tiny_model_dir, peft_adapter_dir) -> None:
    """Two adapters on one MegatronModel (tp=2 + sp): the second (other targets, rank, optimizer, loss and rows)
    steps between the first's steps and holds pending gradients while the first trains; the first still trains
    exactly like peft LoRA alone, and the second learned something of its own (a PEFT adapter with non-zero B)."""
    reference = megatron_run(1, '--backend', 'TransformersModel', '--adapter', peft_adapter_dir)
    result = megatron_run(2, '--tp', 2, '--sp', '--adapter', peft_adapter_dir, '--neighbour')
    assert_same_run(result, reference)
    assert_same_logprobs(result['after']['logprobs'], reference['after']['logprobs'])
    from safetensors.torch import load_file

    neighbour = load_file(f'{result["neighbour_checkpoint"]}/adapter_model.safetensors')
    b_keys = [k for k in neighbour if 'lora_B' in k]
    assert b_keys and all('q_proj' in k or 'v_proj' in k for k in b_keys)
    assert all(neighbour[k].abs().max() > 0 for k in b_keys)


@pytest.mark.slow
def test_lora_under_pp2_with_sequence_parallel_tp2(megatron_run, tiny_model_dir, peft_adapter_dir) -> None:
    reference = megatron_run(1, '--backend', 'TransformersModel', '--adapter', peft_adapter_dir)
    assert_same_run(megatron_run(4, '--tp', 2, '--sp', '--pp', 2, '--adapter', peft_adapter_dir), reference)


@pytest.mark.parametrize('loss', ['GRPOLoss', 'DPOLoss', 'GKDLoss'])
def test_losses_under_tp2(megatron_run, small_model_dir, loss) -> None:
    """Token (GRPO, with on-policy old_logps), sequence (DPO pairs) and full-logits (GKD, vocabulary gathered
    over tp) losses run unchanged."""
    extra = ('--loss', loss) + (('--teacher', small_model_dir) if loss == 'GKDLoss' else ())
    assert_same_run(megatron_run(2, '--tp', 2, *extra), megatron_run(1, '--backend', 'TransformersModel', *extra))


@pytest.mark.parametrize(
    'nproc,args',
    [(1, ()), (2, ('--distributed-optimizer',)), (2, ('--pp', 2))],
    ids=['single', 'dp2_distributed_optimizer', 'pp2'],
)
def test_resume_from_save_and_load_is_exact(megatron_run, nproc, args) -> None:
    """Save with the optimizer after step 2, load into a fresh model, train step 3 again: bit-identical."""
    result = megatron_run(nproc, '--resume-after', 2, *args)
    assert result['resumed_losses'] == result['losses'][2:]
    assert result['resumed_after']['logprobs'] == result['after']['logprobs']
