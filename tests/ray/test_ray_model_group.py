"""Models hosted in a 2-actor Ray group (one data-parallel group shared by the tests of this file) train exactly like
one local process: TransformersModel (batches made in the group, one checkpoint) and the multi-tenant
MultiLoraTransformersModel (``{adapter: rows}`` calls, each tenant's rows split across the two data ranks)."""

from __future__ import annotations

import pytest

import twinkle_core
from twinkle_core.dataset import DataLoader
from twinkle_core.fixtures import random_token_rows
from twinkle_core.mesh import DeviceGroup

pytest.importorskip('ray')
pytestmark = pytest.mark.slow

LORA = {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear', 'init_lora_weights': 'gaussian'}


@pytest.fixture(scope='module')
def model_group(ray_cluster):
    twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='model', ranks=2)])
    yield 'model'
    twinkle_core.shutdown()


def train(model, batches_or_loader) -> list[float]:
    model.set_optimizer('AdamW', lr=1e-3)
    losses = []
    for batch in batches_or_loader:
        losses.append(model.forward_backward(inputs=batch)['loss'])
        model.clip_grad_and_step(max_norm=1.0)
    return losses


def test_two_actor_group_matches_local_training_and_saves_one_checkpoint(model_group, tiny_model_dir, tmp_path) -> None:
    import torch

    from twinkle_transformers.model import TransformersModel

    rows, eval_rows = random_token_rows(32), random_token_rows(6, seed=1)
    torch.manual_seed(0)
    seed_model = TransformersModel(tiny_model_dir)
    seed_model.add_adapter_to_model('default', LORA)
    start = seed_model.save('start', output_dir=str(tmp_path))  # both runs start from these adapter weights

    local = TransformersModel(tiny_model_dir)
    local.load(start)
    local_losses = train(local, DataLoader(rows, batch_size=8))
    local_eval = local.forward_only(inputs=eval_rows)

    remote = TransformersModel(tiny_model_dir, remote_group=model_group)
    remote.load(start)
    # batches are made and used in the group (lazy: they never reach the driver)
    loader = DataLoader(rows, batch_size=8, remote_group=model_group, lazy_collect=True)
    remote_losses = train(remote, loader)
    remote_eval = remote.forward_only(inputs=eval_rows)  # driver rows: split 3 + 3, concatenated back
    saved = remote.save('final', output_dir=str(tmp_path))

    assert remote_losses == pytest.approx(local_losses, abs=1e-4)
    assert remote_eval['loss'] == pytest.approx(local_eval['loss'], abs=1e-4)
    assert len(remote_eval['logprobs']) == len(eval_rows)
    for got, want in zip(remote_eval['logprobs'], local_eval['logprobs']):
        assert got == pytest.approx(want, abs=1e-4)
    reloaded = TransformersModel(tiny_model_dir)
    reloaded.load(saved)
    assert reloaded.forward_only(inputs=eval_rows)['loss'] == pytest.approx(local_eval['loss'], abs=1e-4)


def test_a_multi_tenant_model_in_the_group_trains_like_one_local_process(model_group, tiny_model_dir, tmp_path) -> None:
    """Two tenants (different ranks and losses) in ``{adapter: rows}`` calls: the proxy splits each tenant's rows
    across the data ranks (tenant 'b' has 3 rows: 2 + 1); losses, log-probs in row order and the checkpoint rank 0
    writes equal one local process (1e-4)."""
    import torch

    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    tenants = {'a': {**LORA, 'r': 4}, 'b': {**LORA, 'target_modules': ['q_proj', 'v_proj']}}
    starts = {}
    torch.manual_seed(0)
    seed_model = MultiLoraTransformersModel(tiny_model_dir)
    for name, lora in tenants.items():
        seed_model.add_adapter_to_model(name, lora)
        starts[name] = seed_model.save(f'start-{name}', output_dir=str(tmp_path), adapter_name=name)
    steps = [{'a': random_token_rows(4, seed=10 + i), 'b': random_token_rows(3, seed=20 + i)} for i in range(3)]

    def run(model) -> tuple[list[dict], dict]:
        for name in tenants:
            model.load(starts[name], adapter_name=name)
            model.set_optimizer('AdamW', lr=1e-3, adapter_name=name)
        model.set_loss('CrossEntropyLoss', adapter_name='b', reduction='sequence_mean')
        outs = []
        for data in steps:
            outs.append(model.forward_backward(inputs=data))
            for name in tenants:
                model.clip_grad_and_step(max_norm=1.0, adapter_name=name)
        return outs, model.forward_only(inputs={name: random_token_rows(5, seed=1) for name in tenants})

    local_outs, local_eval = run(MultiLoraTransformersModel(tiny_model_dir))
    remote = MultiLoraTransformersModel(tiny_model_dir, remote_group=model_group)
    remote_outs, remote_eval = run(remote)
    saved = remote.save('final-b', output_dir=str(tmp_path), adapter_name='b')

    for got, want in zip([*remote_outs, remote_eval], [*local_outs, local_eval]):
        for name in tenants:
            assert got[name]['loss'] == pytest.approx(want[name]['loss'], abs=1e-4)
            assert len(got[name]['logprobs']) == len(want[name]['logprobs'])
            for a, b in zip(got[name]['logprobs'], want[name]['logprobs']):
                assert a == pytest.approx(b, abs=1e-4)
    reloaded = MultiLoraTransformersModel(tiny_model_dir)
    reloaded.load(saved, adapter_name='b')
    reloaded.set_loss('CrossEntropyLoss', adapter_name='b', reduction='sequence_mean')
    evaluation = reloaded.forward_only(inputs=random_token_rows(5, seed=1), adapter_name='b')
    assert evaluation['loss'] == pytest.approx(local_eval['b']['loss'], abs=1e-4)
