"""Model options on the service: ``gradient_checkpointing`` in a model's ``backend_args`` (checked against what the
backend declares, then given to it), and mesh dimensions a backend does not implement refused by the config check
(`twinkle_core.model.mesh_support`, the same check the backend's constructor makes)."""

from __future__ import annotations

import pytest
from test_capabilities import model_file
from test_config_file import HAS_RAY, errors_of

from twinkle_core.model import ModelCapabilities
from twinkle_server.config import ModelSpec, ServerConfig, load_server_config
from twinkle_server.engine.deployment import build_model_hosts
from twinkle_transformers.model import TransformersModel


class NoCheckpointingBackend(TransformersModel):
    """Declares no gradient_checkpointing."""

    capabilities = ModelCapabilities(max_adapters=1, takes_device=True)


@pytest.fixture(autouse=True)
def registered():
    from twinkle_core.registry import register, unregister

    register('model', 'NoCheckpointingBackend')(NoCheckpointingBackend)
    yield
    unregister('model', 'NoCheckpointingBackend')


@pytest.fixture
def tiny_env(monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))


def test_gradient_checkpointing_reaches_the_backend(tmp_path, tiny_env) -> None:
    extra = '    backend_args: {gradient_checkpointing: {every: 2}}\n'
    config = load_server_config(model_file(tmp_path, 'MultiLoraTransformersModel', 'TorchSampler', extra))
    host = build_model_hosts(config, device='cpu')['tiny']
    assert host.model.checkpointed_layers == [0, 2]


def test_gradient_checkpointing_is_checked_before_anything_is_built(tmp_path, tiny_env) -> None:
    undeclared = model_file(
        tmp_path, 'NoCheckpointingBackend', 'TorchSampler', '    backend_args: {gradient_checkpointing: true}\n'
    )
    with pytest.raises(ValueError, match="model 'tiny': backend_args: NoCheckpointingBackend takes no gradient_che"):
        build_model_hosts(load_server_config(undeclared))
    bad = model_file(
        tmp_path, 'TransformersModel', 'TorchSampler', '    backend_args: {gradient_checkpointing: often}\n'
    )
    with pytest.raises(ValueError, match='gradient_checkpointing must be True, False'):
        build_model_hosts(load_server_config(bad))


@pytest.mark.skipif(not HAS_RAY, reason='a mesh is a deployment.mode: ray setting')
def test_a_mesh_dimension_the_backend_lacks_is_refused_by_the_config_check(tmp_path, tiny_env) -> None:
    extra = '    train_group: {ranks: 2}\n    mesh: {pp_size: 2}\n'
    (error,) = errors_of(model_file(tmp_path, 'TransformersModel', 'TorchSampler', extra, 'deployment:\n  mode: ray\n'))
    assert 'models[0].mesh: pp_size=2' in error and 'is not implemented by TransformersModel' in error
    assert '(it implements: dp_size, fsdp_size, tp_size, cp_size, ep_size)' in error


@pytest.mark.skipif(not HAS_RAY, reason='a mesh is a deployment.mode: ray setting')
def test_expert_parallelism_passes_the_config_check(tmp_path, tiny_env) -> None:
    """The config check cannot see whether the model has experts: its construction refuses a dense one."""
    extra = '    train_group: {ranks: 2}\n    mesh: {dp_size: 2, ep_size: 2}\n'
    config = load_server_config(
        model_file(tmp_path, 'TransformersModel', 'TorchSampler', extra, 'deployment:\n  mode: ray\n')
    )
    assert config.model_specs['tiny'].mesh == {'dp_size': 2, 'ep_size': 2}


@pytest.mark.skipif(not HAS_RAY, reason='a mesh is a deployment.mode: ray setting')
def test_sequence_parallelism_passes_the_config_check_by_either_name(tmp_path, tiny_env) -> None:
    for key in ('sp_size', 'cp_size'):
        extra = f'    train_group: {{ranks: 2}}\n    mesh: {{{key}: 2}}\n'
        config = load_server_config(
            model_file(tmp_path, 'TransformersModel', 'TorchSampler', extra, 'deployment:\n  mode: ray\n')
        )
        assert config.model_specs['tiny'].mesh == {key: 2}


@pytest.mark.timeout(300)
def test_checkpointing_through_the_service_trains_like_the_plain_model(tmp_path, tiny_model_dir, sft_data) -> None:
    """One server hosts the tiny model twice, plain and checkpointed: the same seeded adapter, the same data,
    the same loss and log-probs after an optimizer step (1e-6)."""
    import tinker

    from twinkle_server import start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    specs = {
        'plain': ModelSpec('plain', str(tiny_model_dir), device='cpu'),
        'ckpt': ModelSpec(
            'ckpt', str(tiny_model_dir), device='cpu', backend_args={'gradient_checkpointing': 'selective'}
        ),
    }
    config = ServerConfig(models={}, model_specs=specs, data_dir=str(tmp_path / 'data'), port=free_port())
    running = start_in_thread(config)
    try:
        assert running.service.host('ckpt').model.checkpointed_layers == [0, 1, 2, 3]
        client = tinker.ServiceClient(base_url=running.base_url, api_key=create_api_key(running.service.store, 'a'))
        runs = {}
        for name in specs:
            trainer = client.create_lora_training_client(base_model=name, rank=4, seed=5).result()
            first = trainer.forward_backward(sft_data, 'cross_entropy').result()
            trainer.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
            after = trainer.forward(sft_data, 'cross_entropy').result()
            runs[name] = [first.metrics['loss:sum'], after.metrics['loss:sum']] + [
                x for out in after.loss_fn_outputs for x in out['logprobs'].tolist()
            ]
    finally:
        running.stop()
    assert runs['ckpt'] == pytest.approx(runs['plain'], abs=1e-6)
    assert runs['plain'][0] != pytest.approx(runs['plain'][1], abs=1e-3)  # it trained
