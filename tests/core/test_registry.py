"""The resolver: @register, the four resolution steps of docs/architecture.md §1 in order, errors that say what
to do."""

from __future__ import annotations

import pytest
from uninstalled_index import UNINSTALLED_DIST, UNINSTALLED_INDEX, UNINSTALLED_NAME, installed

from twinkle_core import registry, resolve, resolve_class
from twinkle_core.errors import ComponentNotFoundError, DistributionNotInstalledError, TwinkleError
from twinkle_core.registry import list_components, register, unregister
from twinkle_core.runtime.local import LocalRuntime


@pytest.fixture
def clean_local():
    before = {k: dict(v) for k, v in registry._local.items()}
    yield
    for k in registry._local:
        registry._local[k] = before[k]


def test_register_resolve_and_override(clean_local) -> None:
    from twinkle_core.loss import Loss

    @register('loss')
    class MyLoss(Loss):
        def __init__(self, scale: float = 1.0) -> None:
            self.scale = scale

        def __call__(self, inputs, outputs, **kwargs):
            return {'loss': self.scale}

    assert resolve_class('loss', 'MyLoss') is MyLoss
    assert resolve('loss', 'MyLoss', scale=2.0).scale == 2.0
    register('loss')(MyLoss)  # re-registering the same object is fine
    with pytest.raises(TwinkleError, match='already registered.*override=True'):
        register('loss', 'MyLoss')(type('Other', (), {}))
    other = register('loss', 'MyLoss', override=True)(type('Other', (), {}))
    assert resolve_class('loss', 'MyLoss') is other
    unregister('loss', 'MyLoss')
    with pytest.raises(ComponentNotFoundError):
        resolve_class('loss', 'MyLoss')


def test_resolve_instance_class_function() -> None:
    from twinkle_core.loss import Loss

    instance = object()
    assert resolve('loss', instance) is instance
    with pytest.raises(TwinkleError, match='already an instance'):
        resolve('loss', instance, scale=1)
    assert isinstance(resolve('runtime', LocalRuntime), LocalRuntime)

    def sum_loss(inputs, outputs, factor=1):
        return inputs['x'] * factor

    wrapped = resolve('loss', sum_loss, factor=3)
    assert isinstance(wrapped, Loss) and wrapped({'x': 2}, {}) == {'loss': 6}


def test_unknown_kind_and_bad_names() -> None:
    with pytest.raises(TwinkleError, match="Unknown component kind 'losss'. Did you mean 'loss'"):
        resolve('losss', 'X')
    with pytest.raises(TwinkleError, match='non-empty string'):
        resolve_class('loss', '')


def test_step1_process_registration_beats_entry_points(clean_local) -> None:
    assert isinstance(resolve('runtime', 'local'), LocalRuntime)  # step 2: twinkle-core's own entry point

    class Shadow(LocalRuntime):
        pass

    register('runtime', 'local')(Shadow)
    assert type(resolve('runtime', 'local')) is Shadow
    unregister('runtime', 'local')
    assert type(resolve('runtime', 'local')) is LocalRuntime


def test_step2_entry_point_listed_with_distribution() -> None:
    rows = {(c.name, c.kind): c for c in list_components('runtime')}
    assert rows[('local', 'runtime')].provider == 'twinkle-core'
    assert rows[('local', 'runtime')].source == 'entry_point'
    assert rows[('local', 'runtime')].target == 'twinkle_core.runtime.local:LocalRuntime'


def test_step3_index_names_the_pip_install_line(registry_dir) -> None:
    # once its distribution is installed, the entry point wins over the index entry (twinkle-vllm and
    # twinkle-megatron are, in the test environment)
    samplers = {c.name: c for c in list_components('sampler')}
    assert samplers['vLLMSampler'].provider == 'twinkle-vllm'
    assert samplers['vLLMSampler'].source == ('entry_point' if installed('twinkle-vllm') else 'index')
    models = {c.name: c for c in list_components('model')}
    assert models['MegatronModel'].provider == 'twinkle-megatron'
    assert models['MegatronModel'].source == ('entry_point' if installed('twinkle-megatron') else 'index')
    # while it is not installed, the index names the pip line (a made-up component no environment installs)
    assert not installed(UNINSTALLED_DIST)
    registry_dir(UNINSTALLED_INDEX)
    with pytest.raises(DistributionNotInstalledError, match=f'Run: pip install {UNINSTALLED_DIST}'):
        resolve('model', UNINSTALLED_NAME)
    rows = {c.name: c for c in list_components('model')}
    assert rows[UNINSTALLED_NAME].provider == UNINSTALLED_DIST and rows[UNINSTALLED_NAME].source == 'index'
    assert rows[UNINSTALLED_NAME].target == f'pip install {UNINSTALLED_DIST}'


def test_step3_installed_distribution_without_the_entry_point(registry_dir) -> None:
    registry_dir("""
        [[component]]
        name = "GhostLoss"
        kind = "loss"
        distribution = "pluggy"
    """)
    with pytest.raises(TwinkleError, match='installed but registers no such entry point'):
        resolve('loss', 'GhostLoss')


def test_malformed_index_is_reported(registry_dir) -> None:
    registry_dir('[[component]]\nname = "X"\nkind = "loss"\n')
    with pytest.raises(TwinkleError, match='exactly one of "distribution" or "hub"'):
        list_components('loss')
    registry_dir('[[component]]\nname = "X"\nkind = "loss"\ncolour = "red"\n')
    with pytest.raises(TwinkleError, match='malformed'):
        list_components('loss')


def test_step4_hub_reference_goes_to_the_hub_loader(monkeypatch) -> None:
    seen = {}

    def fake(kind, ref, *, trust_remote_code=None):
        seen.update(kind=kind, ref=ref, trust=trust_remote_code)
        return dict

    monkeypatch.setattr('twinkle_core.hub.loader.load_hub_component', fake)
    assert resolve('loss', 'ms://org/repo@v1:X', trust_remote_code=True) == {}
    assert seen == {'kind': 'loss', 'ref': 'ms://org/repo@v1:X', 'trust': True}


def test_unknown_name_lists_close_matches_and_providers(registry_dir) -> None:
    with pytest.raises(ComponentNotFoundError) as info:
        resolve('runtime', 'locall')
    text = str(info.value)
    assert "No runtime named 'locall'" in text
    assert 'Did you mean: local' in text
    assert 'twinkle-core: local' in text
    registry_dir(UNINSTALLED_INDEX)
    with pytest.raises(ComponentNotFoundError) as info:
        resolve('model', 'DeepSpeed')
    assert f'Did you mean: {UNINSTALLED_NAME}' in str(info.value)
    assert 'Also known to the registry/ index (installable):' in str(info.value)
    assert f'{UNINSTALLED_NAME}: pip install {UNINSTALLED_DIST}' in str(info.value)


def test_unknown_name_when_nothing_provides_the_kind(monkeypatch, registry_dir) -> None:
    from twinkle_core import plugins

    registry_dir('')
    monkeypatch.setattr(plugins, 'entry_points_of', lambda kind: ())
    with pytest.raises(ComponentNotFoundError, match='No provider of kind .kernel. is installed'):
        resolve('kernel', 'nothing')


def test_seed_style_import(clean_local) -> None:
    @register('loss')
    def seed_style_loss(inputs, outputs):
        return 0

    from twinkle_core.loss import seed_style_loss as imported

    assert imported is seed_style_loss
    with pytest.raises(ImportError):
        from twinkle_core.loss import NoSuchLoss  # noqa: F401
    import twinkle_core.loss as loss_module

    with pytest.raises(AttributeError, match="has no attribute 'NoSuchLoss'"):
        getattr(loss_module, 'NoSuchLoss')  # noqa: B009 - the attribute access under test
    with pytest.raises(AttributeError):
        getattr(loss_module, '_private')  # noqa: B009
