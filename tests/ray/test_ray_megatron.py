"""MegatronModel hosted in a 2-actor Ray group (tp=2: each actor one Megatron rank) trains like TransformersModel in
this process, and saves one Hugging Face checkpoint."""

from __future__ import annotations

import pytest

import twinkle_core
from twinkle_core.fixtures import random_token_rows
from twinkle_core.mesh import DeviceGroup, DeviceMesh

pytest.importorskip('ray')
pytest.importorskip('twinkle_megatron')

TOL = 1e-5  # fp32; tensor-parallel sums in another order differ by ~1e-6 (tests/megatron/test_equality.py)


def train(model, batches) -> list[float]:
    model.set_optimizer('AdamW', lr=2e-3, weight_decay=0.0)
    losses = []
    for batch in batches:
        losses.append(model.forward_backward(inputs=batch)['loss'])
        model.clip_grad_and_step(max_norm=1.0)
    return losses


@pytest.mark.slow
def test_megatron_tp2_in_a_ray_group_trains_like_one_local_process(ray_cluster, tiny_model_dir, tmp_path) -> None:
    from twinkle_transformers.model import TransformersModel

    batches = [random_token_rows(8, seed=10 + i) for i in range(3)]
    eval_rows = random_token_rows(4, seed=1)
    local = TransformersModel(tiny_model_dir)
    local_losses = train(local, batches)
    local_eval = local.forward_only(inputs=eval_rows)

    twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='model', ranks=2)])
    try:
        from twinkle_core.model import MegatronModel

        remote = MegatronModel(
            tiny_model_dir, remote_group='model', device_mesh=DeviceMesh.from_sizes(tp_size=2, device_type='cpu')
        )
        remote_losses = train(remote, batches)
        remote_eval = remote.forward_only(inputs=eval_rows)
        saved = remote.save('final', output_dir=str(tmp_path))
    finally:
        twinkle_core.shutdown()

    assert remote_losses == pytest.approx(local_losses, abs=TOL)
    assert remote_eval['loss'] == pytest.approx(local_eval['loss'], abs=TOL)
    for got, want in zip(remote_eval['logprobs'], local_eval['logprobs']):
        assert got == pytest.approx(want, abs=TOL, rel=TOL)
    reloaded = TransformersModel(tiny_model_dir)
    reloaded.load(saved)
    assert reloaded.forward_only(inputs=eval_rows)['loss'] == pytest.approx(remote_eval['loss'], abs=TOL)
