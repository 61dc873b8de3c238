"""Optimizer state in checkpoints of sharded models: saved by name (FQN), consolidated on rank 0, resumable on any
world size. Resuming k steps from a checkpoint must equal training 2k steps straight."""

from __future__ import annotations

import pytest
import torch
from spmd_runner import run_worker

from twinkle_core.errors import InvalidInputError
from twinkle_core.fixtures import random_token_rows
from twinkle_transformers import checkpoint as ckpt
from twinkle_transformers import mesh_checkpoint
from twinkle_transformers.model import TransformersModel

K = 2  # steps before the checkpoint, and after it
LORA = {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear', 'init_lora_weights': 'gaussian'}
FSDP = ('--fsdp', '2')


def _train(model: TransformersModel, batches: list) -> list[float]:
    losses = []
    for batch in batches:
        losses.append(model.forward_backward(inputs=batch)['loss'])
        model.clip_grad_and_step(max_norm=1.0)
    return losses


def _lora_model(model_dir) -> TransformersModel:
    torch.manual_seed(0)
    model = TransformersModel(str(model_dir))
    model.add_adapter_to_model('default', LORA)
    model.set_optimizer('AdamW', lr=1e-3)
    return model


# ---- single process: the file format ---------------------------------------------------------------------
def test_optimizer_state_is_saved_by_parameter_name(tiny_model_dir, tmp_path) -> None:
    model = _lora_model(tiny_model_dir)
    _train(model, [random_token_rows(4)])
    path = model.save('ckpt', output_dir=str(tmp_path), save_optimizer=True)
    saved = ckpt.load_training_state(path)['train_state']['optimizer']
    trainable = {name for name, p in model.model.named_parameters() if p.requires_grad}
    assert set(saved['state']) == trainable
    assert set(saved['param_groups'][0]['params']) == trainable
    assert all(int(s['step']) == 1 for s in saved['state'].values())
    assert any(torch.count_nonzero(s['exp_avg']) > 0 for s in saved['state'].values())  # lora_B moved


def test_saving_before_the_first_step_leaves_the_optimizer_untouched(tiny_model_dir, tmp_path) -> None:
    model = _lora_model(tiny_model_dir)
    path = model.save('step-0', output_dir=str(tmp_path), save_optimizer=True)
    assert not model.state.optimizer.state  # no zero-lr initialisation step was taken to save it
    saved = ckpt.load_training_state(path)['train_state']['optimizer']
    assert saved['state'] == {} and all(isinstance(n, str) for n in saved['param_groups'][0]['params'])

    resumed = TransformersModel(str(tiny_model_dir))
    resumed.load(path, load_optimizer=True)
    assert not resumed.state.optimizer.state and resumed.state.current_lr() == pytest.approx(1e-3)
    batches = [random_token_rows(4, seed=s) for s in range(2)]
    assert _train(resumed, batches) == pytest.approx(_train(model, batches), abs=1e-6)


def test_index_keyed_optimizer_state_of_older_checkpoints_still_loads(tiny_model_dir, tmp_path) -> None:
    batches = [random_token_rows(4, seed=s) for s in range(3)]
    model = _lora_model(tiny_model_dir)
    _train(model, batches[:2])
    path = model.save('old', output_dir=str(tmp_path), save_optimizer=True)
    payload = torch.load(f'{path}/{ckpt.TRAINING_STATE_FILE}', weights_only=True)
    payload['train_state']['optimizer'] = model.state.optimizer.state_dict()  # the format before names
    torch.save(payload, f'{path}/{ckpt.TRAINING_STATE_FILE}')
    expected = _train(model, batches[2:])

    resumed = TransformersModel(str(tiny_model_dir))
    resumed.load(path, load_optimizer=True)
    assert _train(resumed, batches[2:]) == pytest.approx(expected, abs=1e-6)


def test_optimizer_state_of_another_shape_is_a_clear_error(tiny_model_dir) -> None:
    model = _lora_model(tiny_model_dir)
    saved = model.state.optimizer.state_dict()
    saved['param_groups'][0]['params'] = saved['param_groups'][0]['params'][:-1]
    with pytest.raises(InvalidInputError, match='another model or adapter'):
        mesh_checkpoint.load_optimizer_state(model.model, model.state.optimizer, saved)


# ---- torchrun: FSDP2 on 2 gloo ranks <-> one process ------------------------------------------------------
@pytest.fixture(scope='module')
def fsdp_lora(tiny_model_dir, tmp_path_factory) -> dict:
    """FSDP2 LoRA: 2K steps straight, and K steps saved with the optimizer."""
    root = tmp_path_factory.mktemp('fsdp_lora')
    return {
        'straight': run_worker(tiny_model_dir, root / 'straight', nproc=2, extra=(*FSDP, '--steps', str(2 * K))),
        'half': run_worker(
            tiny_model_dir, root / 'half', nproc=2, extra=(*FSDP, '--steps', str(K), '--save-optimizer')
        ),
    }


def _resume(model_dir, out, checkpoint: str, *, nproc: int, extra: tuple[str, ...] = ()) -> dict:
    return run_worker(
        model_dir, out, nproc=nproc, extra=(*extra, '--steps', str(K), '--skip-steps', str(K), '--resume', checkpoint)
    )


@pytest.mark.slow
def test_fsdp2_resume_on_two_ranks_equals_straight_training(tiny_model_dir, tmp_path, fsdp_lora) -> None:
    resumed = _resume(tiny_model_dir, tmp_path, fsdp_lora['half']['checkpoint'], nproc=2, extra=FSDP)
    assert resumed['optimizer_steps'] == 2 * K
    assert resumed['losses'] == pytest.approx(fsdp_lora['straight']['losses'][K:], abs=1e-5)


@pytest.mark.slow
def test_fsdp2_checkpoint_resumes_in_one_process(tiny_model_dir, tmp_path, fsdp_lora) -> None:
    want = fsdp_lora['straight']['losses'][K:]
    resumed = _resume(tiny_model_dir, tmp_path / 'optimizer', fsdp_lora['half']['checkpoint'], nproc=1)
    assert resumed['losses'] == pytest.approx(want, abs=1e-4)
    # The control: without the optimizer state the same weights train differently (the check can fail).
    weights_only = _resume(
        tiny_model_dir, tmp_path / 'weights', fsdp_lora['half']['checkpoint'], nproc=1, extra=('--weights-only',)
    )
    assert max(abs(a - b) for a, b in zip(weights_only['losses'][1:], want[1:])) > 1e-3


@pytest.mark.slow
def test_one_process_checkpoint_resumes_under_fsdp2(tiny_model_dir, tmp_path, fsdp_lora) -> None:
    half = run_worker(tiny_model_dir, tmp_path / 'half', extra=('--steps', str(K), '--save-optimizer'))
    resumed = _resume(tiny_model_dir, tmp_path / 'resumed', half['checkpoint'], nproc=2, extra=FSDP)
    assert resumed['losses'] == pytest.approx(fsdp_lora['straight']['losses'][K:], abs=1e-4)


@pytest.mark.slow
def test_ddp_checkpoint_resumes_under_fsdp2(tiny_model_dir, tmp_path, fsdp_lora) -> None:
    half = run_worker(
        tiny_model_dir, tmp_path / 'half', nproc=2, extra=('--dp', '2', '--steps', str(K), '--save-optimizer')
    )
    resumed = _resume(tiny_model_dir, tmp_path / 'resumed', half['checkpoint'], nproc=2, extra=FSDP)
    assert resumed['losses'] == pytest.approx(fsdp_lora['straight']['losses'][K:], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['--fsdp', '--tp'])
def test_full_parameter_optimizer_checkpoint_resumes_on_any_world_size(tiny_model_dir, tmp_path, strategy) -> None:
    mesh = (strategy, '2', '--full')
    straight = run_worker(tiny_model_dir, tmp_path / 'straight', nproc=2, extra=(*mesh, '--steps', str(2 * K)))
    half = run_worker(tiny_model_dir, tmp_path / 'half', nproc=2, extra=(*mesh, '--steps', str(K), '--save-optimizer'))
    resumed = _resume(tiny_model_dir, tmp_path / 'resumed', half['checkpoint'], nproc=2, extra=mesh)
    single = _resume(tiny_model_dir, tmp_path / 'single', half['checkpoint'], nproc=1, extra=('--full',))
    # FSDP2 resumes bit-for-bit; TP replicas drift by float noise (~1e-4, see test_spmd_training).
    assert resumed['losses'] == pytest.approx(straight['losses'][K:], abs=1e-5 if strategy == '--fsdp' else 1e-4)
    assert single['losses'] == pytest.approx(resumed['losses'], abs=1e-4)
