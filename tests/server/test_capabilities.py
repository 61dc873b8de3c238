"""The server asks a backend and a sampler what they declare (`ModelCapabilities`, `SamplerCapabilities`; the plugin
contract of docs/extending.md), never their names or constructor signatures. Third-party classes registered here
under names of their own (subclasses of the Transformers ones, so they really train and sample) are checked, built
and refused exactly as their declarations say, through the entries the server itself uses: the config checker
(`load_server_config`), host building (`build_model_hosts`) and a running server's adapter limit."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from test_config_file import HAS_RAY, errors_of, write

from twinkle_core.model import ModelCapabilities
from twinkle_server.config import load_server_config
from twinkle_server.engine.deployment import build_model_hosts
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.multi_lora.model import MultiLoraTransformersModel
from twinkle_transformers.sampler import TorchSampler


class ThirdPartyBackend(TransformersModel):
    """One adapter at a time (not multi-tenant), no pass strategies; takes ``device=`` and ``device_mesh=`` but only
    declares so (its signature names neither)."""

    capabilities = ModelCapabilities(max_adapters=1, takes_device=True, takes_device_mesh=True)
    built_with: list[dict] = []

    def __init__(self, model_id, **kwargs):
        type(self).built_with.append(dict(kwargs))
        super().__init__(model_id, **kwargs)


class SingleRankBackend(TransformersModel):
    """Its inherited signature names ``device_mesh``, but it declares it trains on one rank."""

    capabilities = dataclasses.replace(TransformersModel.capabilities, takes_device_mesh=False)


class TenantBackend(MultiLoraTransformersModel):
    """Multi-tenant (mixed adapters, pass strategies), declared the same way as the first-party one."""

    capabilities = MultiLoraTransformersModel.capabilities


class ThirdPartySampler(TorchSampler):
    """Declares it takes ``device=`` (its signature does not name it)."""

    capabilities = TorchSampler.capabilities
    built_with: list[dict] = []

    def __init__(self, model_id=None, **kwargs):
        type(self).built_with.append(dict(kwargs))
        super().__init__(model_id, **kwargs)


class SelfPlacingSampler(ThirdPartySampler):
    """Declares it places itself: it must not be given a device."""

    capabilities = dataclasses.replace(TorchSampler.capabilities, takes_device=False)
    built_with: list[dict] = []


BACKENDS = (ThirdPartyBackend, SingleRankBackend, TenantBackend)
SAMPLERS = (ThirdPartySampler, SelfPlacingSampler)


@pytest.fixture(scope='module', autouse=True)
def registered():
    from twinkle_core.registry import register, unregister

    for cls in BACKENDS:
        register('model', cls.__name__)(cls)
    for cls in SAMPLERS:
        register('sampler', cls.__name__)(cls)
    yield
    for cls in BACKENDS:
        unregister('model', cls.__name__)
    for cls in SAMPLERS:
        unregister('sampler', cls.__name__)


def model_file(tmp_path, backend: str, sampler: str = 'ThirdPartySampler', extra: str = '', top: str = ''):
    return write(
        tmp_path,
        f"""{top}storage:
  data_dir: ./data
models:
  - name: tiny
    path: ${{TINY}}
    backend: {backend}
    sampler: {sampler}
{extra}""",
    )


@pytest.fixture
def tiny_env(monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    return tiny_model_dir


def test_third_party_classes_are_built_with_what_they_declare(tmp_path, tiny_env):
    config = load_server_config(model_file(tmp_path, 'ThirdPartyBackend', extra='    device: cpu\n'))
    host = build_model_hosts(config)['tiny']
    assert isinstance(host.model, ThirdPartyBackend) and isinstance(host.sampler, ThirdPartySampler)
    assert ThirdPartyBackend.built_with[-1] == {'device': 'cpu'}
    assert ThirdPartySampler.built_with[-1] == {'device': 'cpu'}  # declared takes_device: given the model's device
    assert host.max_adapters == 1 and not host.model.capabilities.mixed_adapters

    config = load_server_config(
        model_file(tmp_path, 'TenantBackend', 'SelfPlacingSampler', '    backend_args: {pass_strategy: mixed}\n')
    )
    host = build_model_hosts(config, device='cpu')['tiny']
    assert isinstance(host.model, TenantBackend) and host.model.planner.strategy == 'mixed'
    assert host.max_adapters is None and host.model.capabilities.mixed_adapters
    assert 'device' not in SelfPlacingSampler.built_with[-1]  # declared it places itself


def test_pass_strategy_is_refused_unless_the_backend_declares_it(tmp_path, tiny_env):
    single = load_server_config(
        model_file(tmp_path, 'ThirdPartyBackend', extra='    backend_args: {pass_strategy: mixed}\n')
    )
    built = len(ThirdPartyBackend.built_with)
    with pytest.raises(
        ValueError,
        match=r"^model 'tiny': backend_args: ThirdPartyBackend takes no pass_strategy: it does not split several "
        r"adapters' queued work into passes \(expected no pass_strategy, or a backend that declares pass strategies",
    ):
        build_model_hosts(single)
    assert len(ThirdPartyBackend.built_with) == built  # refused before anything was built

    tenant = load_server_config(
        model_file(tmp_path, 'TenantBackend', extra='    backend_args: {pass_strategy: fast}\n')
    )
    with pytest.raises(
        ValueError, match=r"unknown pass strategy 'fast' for TenantBackend \(expected one of auto, mixed, one_by_one\)"
    ):
        build_model_hosts(tenant)


@pytest.mark.skipif(not HAS_RAY, reason='deployment.mode: ray needs twinkle-ray')
def test_a_training_group_of_several_ranks_needs_a_declared_mesh(tmp_path, tiny_env):
    ray = 'deployment:\n  mode: ray\n'
    group = '    train_group: {ranks: 2}\n'
    config = load_server_config(model_file(tmp_path, 'ThirdPartyBackend', extra=group, top=ray))
    assert config.model_specs['tiny'].train_group.ranks == 2
    assert errors_of(model_file(tmp_path, 'SingleRankBackend', extra=group, top=ray)) == [
        f'{tmp_path / "server.yaml"}:10: models[0].train_group.ranks: SingleRankBackend trains on one rank (it takes '
        'no device_mesh) (expected ranks: 1, or a backend that takes a mesh (e.g. TransformersModel, one adapter '
        'at a time))'
    ]


def test_a_backend_that_is_not_multi_tenant_refuses_a_second_training_model(tmp_path, tiny_env):
    tinker = pytest.importorskip('tinker')
    from twinkle_server.launch import free_port, start_in_thread
    from twinkle_server.service.auth import create_api_key

    logging.getLogger('tinker').setLevel(logging.ERROR)
    path = model_file(
        tmp_path, 'ThirdPartyBackend', extra='    device: cpu\n', top=f'server: {{port: {free_port()}}}\n'
    )
    running = start_in_thread(load_server_config(path))
    try:
        client = tinker.ServiceClient(base_url=running.base_url, api_key=create_api_key(running.service.store, 'dora'))
        client.create_lora_training_client(base_model='tiny', rank=4).result()
        with pytest.raises(
            tinker.PermissionDeniedError,
            match=r"base model 'tiny' is served by ThirdPartyBackend, which trains at most 1 adapter\(s\) at once",
        ):
            client.create_lora_training_client(base_model='tiny', rank=4).result()
    finally:
        running.stop()
