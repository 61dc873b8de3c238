"""torchrun on CPU (gloo): DDP / FSDP2 / TP training equals one process on the same global batches, and the
checkpoint rank 0 writes loads in a single process (any world size can resume it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spmd_runner import run_worker

TOL = 1e-4


@pytest.fixture(scope='module')
def single_lora(tiny_model_dir, tmp_path_factory) -> dict:
    return run_worker(tiny_model_dir, tmp_path_factory.mktemp('single_lora'))


def assert_same_run(dist: dict, single: dict, *, token_tol: float = TOL) -> None:
    assert dist['losses'] == pytest.approx(single['losses'], abs=TOL)
    assert dist['eval_loss'] == pytest.approx(single['eval_loss'], abs=TOL)
    for got, want in zip(dist['eval_logprobs'], single['eval_logprobs']):
        assert got == pytest.approx(want, abs=token_tol)


def reload_and_evaluate(model_dir: Path, result: dict) -> dict:
    """Load the checkpoint into a fresh single-process model and evaluate the run's eval rows."""
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(str(model_dir))
    model.load(result['checkpoint'])
    return model.forward_only(inputs=result['eval_rows'])


def test_ddp_two_ranks_match_one_process_and_checkpoint_reloads(tiny_model_dir, tmp_path, single_lora) -> None:
    ddp = run_worker(tiny_model_dir, tmp_path, nproc=2, extra=('--dp', '2'))
    assert ddp['world_size'] == 2
    assert_same_run(ddp, single_lora)
    assert ddp['losses'] != single_lora['losses'][:1] * len(ddp['losses'])  # the curve moves: it trained
    reloaded = reload_and_evaluate(tiny_model_dir, ddp)
    assert reloaded['loss'] == pytest.approx(ddp['eval_loss'], abs=TOL)


@pytest.mark.parametrize('strategy', ['--dp', '--fsdp'])
def test_log_probs_from_hidden_states_under_ddp_and_fsdp2(tiny_model_dir, tmp_path, single_lora, strategy) -> None:
    """The memory-bounded log-prob path (the default for large batches) runs the model's root forward: calling
    its decoder alone skipped DDP's forward hooks (each rank stepped on its own gradients), and under FSDP2 it was
    not taken at all (the output weight is a shard until the root forward gathers it)."""
    run = run_worker(tiny_model_dir, tmp_path, nproc=2, extra=(strategy, '2', '--logps-from-hidden'))
    assert run['hidden_state_logps'] > 0  # the path was taken
    assert run['grad_norms'] == pytest.approx(single_lora['grad_norms'], abs=TOL)
    assert_same_run(run, single_lora)


@pytest.mark.slow
def test_a_lora_critic_under_ddp_matches_one_process(tiny_model_dir, tmp_path) -> None:
    """`TransformersValueModel` (a PPO critic) trains data-parallel like one process: `PPOValueLoss` per step,
    the head's values of the evaluation rows."""
    single = run_worker(tiny_model_dir, tmp_path / 'single', extra=('--value-model',))
    ddp = run_worker(tiny_model_dir, tmp_path / 'ddp', nproc=2, extra=('--value-model', '--dp', '2'))
    assert ddp['world_size'] == 2 and single['losses'][-1] < single['losses'][0], single['losses']
    assert_same_run(ddp, single)


@pytest.mark.slow
def test_fsdp2_lora_matches_one_process_and_consolidated_checkpoint_reloads(
    tiny_model_dir, tmp_path, single_lora
) -> None:
    fsdp = run_worker(tiny_model_dir, tmp_path, nproc=2, extra=('--fsdp', '2'))
    assert_same_run(fsdp, single_lora)
    files = sorted(os.listdir(fsdp['checkpoint']))
    assert 'adapter_model.safetensors' in files and 'adapter_config.json' in files  # PEFT format, one file
    reloaded = reload_and_evaluate(tiny_model_dir, fsdp)
    assert reloaded['loss'] == pytest.approx(fsdp['eval_loss'], abs=TOL)


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['--fsdp', '--tp'])
def test_full_parameter_fsdp2_and_tp_match_one_process(tiny_model_dir, tmp_path, strategy) -> None:
    single = run_worker(tiny_model_dir, tmp_path / 'single', extra=('--full',))
    dist = run_worker(tiny_model_dir, tmp_path / 'dist', nproc=2, extra=(strategy, '2', '--full'))
    # Row-parallel matmuls sum in another order; Adam turns the float noise of near-zero gradients into lr-sized
    # updates, so after 4 full-parameter steps single-token logprobs drift by ~1e-3 (the first step is exact).
    assert dist['losses'][0] == pytest.approx(single['losses'][0], abs=1e-5)
    assert_same_run(dist, single, token_tol=TOL if strategy == '--fsdp' else 5e-3)
    assert 'model.safetensors' in os.listdir(dist['checkpoint'])  # HF format, consolidated
    reloaded = reload_and_evaluate(tiny_model_dir, dist)
    assert reloaded['loss'] == pytest.approx(dist['eval_loss'], abs=TOL)
