"""Layer kernels by name, through the real clients offline: `huggingface_hub` finds the kernel repo in a
pre-filled cache (``kernels--org--repo``), twinkle verifies every file against its pin, then the Hugging Face
`kernels` library imports it and `kernelize` installs it. The kernelized tiny Qwen3 computes the same logits and
gradients (fp32, 1e-6; measured: bit-identical); tampered, extra and bytecode files are refused before any of the
kernel's code runs; an unpinned kernel needs trust; a kernel that replaces nothing is an error."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from core_helpers import REPO_ROOT, run_twinkle

from twinkle_core.errors import IntegrityError, InvalidInputError, UntrustedRemoteCodeError
from twinkle_core.fixtures.hub_cache import FIRST_PARTY_KERNELS, install_first_party_kernels, populate_hf_cache
from twinkle_core.hub.integrity import file_hashes
from twinkle_core.kernel import LayerKernel, apply_kernels
from twinkle_core.registry import resolve

pytest.importorskip('kernels')
RMSNORM = 'hf://twinkle-community/rmsnorm-kernel'
KERNELS = ['RMSNorm', 'SwiGLUMLP']
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [100, 200, 300, 400, 500, 600, 700, 800]])


@pytest.fixture
def kernel_cache(offline_hubs) -> Path:
    """The first-party kernels in an offline Hugging Face cache, at the revisions registry/ pins."""
    install_first_party_kernels(offline_hubs['hf'])
    return offline_hubs['hf']


def tampered_copy(tmp_path: Path, change) -> Path:
    src = tmp_path / 'rmsnorm-kernel'
    shutil.copytree(REPO_ROOT / 'hub' / 'rmsnorm-kernel', src)
    change(src)
    return src


def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def loss_and_grads(model):
    model.zero_grad()
    out = model(input_ids=IDS, labels=IDS)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_pins_in_registry_are_the_hub_folders_file_by_file() -> None:
    from twinkle_core import registry_index

    pins = {e.hub: e for e in registry_index.entries('kernel')}
    for folder, repo in FIRST_PARTY_KERNELS.items():
        pin = pins[f'hf://{repo}']
        assert pin.is_pin and pin.files == file_hashes(REPO_ROOT / 'hub' / folder), folder


@pytest.mark.parametrize('mode', ['training', 'inference'])
def test_kernelized_qwen3_computes_what_the_original_does(kernel_cache, tiny_model_dir, mode) -> None:
    model, reference = hf_model(tiny_model_dir), hf_model(tiny_model_dir)
    counts = apply_kernels(model, KERNELS, mode=mode, device='cpu')
    layers = model.config.num_hidden_layers
    assert counts == {'RMSNorm': 4 * layers + 1, 'SwiGLUMLP': layers}  # 2 norms + q/k norms per layer, final
    kernel = resolve('kernel', 'RMSNorm')
    assert isinstance(kernel, LayerKernel) and kernel.source == f'{RMSNORM}@v1'
    assert type(model.model.norm).forward is not model.model.norm.forward.__func__  # really replaced
    logits, grads = loss_and_grads(model)
    ref_logits, ref_grads = loss_and_grads(reference)
    torch.testing.assert_close(logits, ref_logits, atol=1e-6, rtol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=0, msg=name)
    # loading through the kernels library wrote no bytecode into the verified folder
    assert not list(kernel_cache.rglob('*.pyc'))


def test_one_call_installs_one_set(kernel_cache, tiny_model_dir) -> None:
    model = hf_model(tiny_model_dir)
    apply_kernels(model, KERNELS, device='cpu')
    assert apply_kernels(model, ['RMSNorm'], device='cpu') == {'RMSNorm': 4 * model.config.num_hidden_layers + 1}
    mlp = model.model.layers[0].mlp
    assert mlp.forward.__func__ is type(mlp).forward  # the MLP got its own forward back


@pytest.mark.parametrize(
    'change, message',
    [
        (
            lambda d: (d / 'build/torch-universal/twinkle_rmsnorm/layers.py').write_text(
                "raise RuntimeError('tampered code ran')\n"
            ),
            r'changed: build/torch-universal/twinkle_rmsnorm/layers\.py',
        ),
        (
            lambda d: (d / 'build/torch-universal/twinkle_rmsnorm/extra.py').write_text(
                "raise RuntimeError('extra code ran')\n"
            ),
            r'not in the pin \(extra\): .*extra\.py',
        ),
        (lambda d: (d / 'README.md').unlink(), 'missing: README.md'),
        (
            lambda d: (
                (d / 'build/torch-universal/twinkle_rmsnorm/__pycache__').mkdir(),
                (d / 'build/torch-universal/twinkle_rmsnorm/__pycache__/layers.cpython-311.pyc').write_bytes(b'x'),
            ),
            'is Python bytecode',
        ),
    ],
    ids=['tampered', 'extra', 'missing', 'bytecode'],
)
def test_altered_kernel_files_are_refused_before_import(offline_hubs, tmp_path, change, message) -> None:
    src = tampered_copy(tmp_path, change)
    populate_hf_cache(offline_hubs['hf'], 'twinkle-community/rmsnorm-kernel', 'v1', src, repo_type='kernel')
    before = set(sys.modules)
    with pytest.raises(IntegrityError, match=message):
        resolve('kernel', 'RMSNorm')
    assert not [m for m in set(sys.modules) - before if 'rmsnorm' in m]  # nothing of it was imported


def test_an_unpinned_kernel_needs_trust_and_says_how_to_pin_it(
    offline_hubs, tmp_path, tiny_model_dir, monkeypatch
) -> None:
    populate_hf_cache(
        offline_hubs['hf'], 'someone/fast-norm', 'v3', REPO_ROOT / 'hub' / 'rmsnorm-kernel', repo_type='kernel'
    )
    with pytest.raises(
        UntrustedRemoteCodeError,
        match=r'not pinned .*twinkle hub hash <folder> --repo hf://someone/fast-norm --revision v3',
    ):
        resolve('kernel', 'hf://someone/fast-norm@v3:RMSNorm')
    trusted = resolve('kernel', 'hf://someone/fast-norm@v3:RMSNorm', trust_remote_code=True)
    assert apply_kernels(hf_model(tiny_model_dir), [trusted])['RMSNorm'] > 0

    # a project's lock file pins it, so no trust is needed (what `twinkle hub hash --repo` prints goes there)
    out = run_twinkle(
        'hub', 'hash', str(REPO_ROOT / 'hub' / 'rmsnorm-kernel'), '--repo', 'hf://someone/fast-norm', '--revision', 'v3'
    )
    assert out.returncode == 0 and '[component.files]' in out.stdout
    lock = tmp_path / 'twinkle.lock'
    lock.write_text(out.stdout)  # valid TOML as printed
    monkeypatch.setenv('TWINKLE_LOCK_FILE', str(lock))
    from twinkle_core import registry_index

    registry_index.refresh()
    try:
        assert isinstance(resolve('kernel', 'hf://someone/fast-norm@v3:RMSNorm'), LayerKernel)
    finally:
        registry_index.refresh()


def test_a_kernel_that_replaces_nothing_is_an_error_and_changes_nothing(kernel_cache) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())
    with pytest.raises(
        InvalidInputError,
        match=r"\['RMSNorm', 'SwiGLUMLP'\] would replace no module of "
        r"Sequential .*classes \['Qwen3MLP'.*tags: none",
    ):
        apply_kernels(model, ['RMSNorm', 'SwiGLUMLP'])
    assert 'forward' not in model[0].__dict__
    with pytest.raises(InvalidInputError, match='mode must be one of'):
        apply_kernels(model, ['RMSNorm'], mode='train')
    with pytest.raises(InvalidInputError, match="does not run on 'mps'"):
        apply_kernels(model, ['RMSNorm'], device='mps')


def test_models_and_samplers_take_kernels_by_name(kernel_cache, tiny_model_dir) -> None:
    rows = [{'input_ids': IDS[0].tolist(), 'labels': IDS[0].tolist()}]
    plain, fast = (
        resolve('model', 'TransformersModel', model_id=str(tiny_model_dir), device='cpu', kernels=k)
        for k in ((), KERNELS)
    )
    layers = fast.model.config.num_hidden_layers
    assert fast.kernels == {'RMSNorm': 4 * layers + 1, 'SwiGLUMLP': layers}
    assert fast.get_train_configs()['kernels'] == fast.kernels
    for model in (plain, fast):
        model.set_optimizer('AdamW', lr=1e-3)
    for _ in range(2):
        want, got = plain.forward_backward(inputs=rows)['loss'], fast.forward_backward(inputs=rows)['loss']
        assert abs(got - want) <= 1e-6
        plain.clip_grad_and_step(), fast.clip_grad_and_step()
    sampler, reference = (
        resolve('sampler', 'TorchSampler', model_id=str(tiny_model_dir), device='cpu', kernels=k, fast_decode=False)
        for k in (KERNELS, ())
    )
    assert sampler.kernels == fast.kernels
    got = sampler.sample([[5, 6, 7]], max_tokens=6, temperature=0.0)[0].sequences[0]
    want = reference.sample([[5, 6, 7]], max_tokens=6, temperature=0.0)[0].sequences[0]
    assert got.tokens == want.tokens and got.logprobs == pytest.approx(want.logprobs, abs=1e-6)
    multi = [
        resolve('model', 'MultiLoraTransformersModel', model_id=str(tiny_model_dir), device='cpu', kernels=k)
        for k in ((), KERNELS)
    ]
    assert multi[1].kernels == fast.kernels
    for m in multi:
        m.add_adapter_to_model(
            'a', {'r': 4, 'target_modules': 'all-linear'}, generator=torch.Generator().manual_seed(0)
        )
    want, got = (m.forward_only(inputs=rows, adapter_name='a')['loss'] for m in multi)
    assert abs(got - want) <= 1e-6
    with pytest.raises(InvalidInputError, match='shares its module with a training model'):
        resolve('sampler', 'TorchSampler', model=plain, kernels=KERNELS)


def test_plugins_list_shows_kernels_and_where_they_come_from() -> None:
    out = run_twinkle('plugins', 'list', '--kind', 'kernel')
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for name, source in (
        ('RMSNorm', 'hf://twinkle-community/rmsnorm-kernel'),
        ('SwiGLUMLP', 'hf://twinkle-community/swiglu-kernel'),
        ('LigerRMSNorm', 'twinkle-transformers'),
        ('LigerSwiGLUMLP', 'twinkle-transformers'),
    ):
        assert source in lines[name], lines


def test_publish_writes_the_kernels_layout_and_it_loads_back(tmp_path, tiny_model_dir) -> None:
    env = {'TWINKLE_HUB_ROOT': str(tmp_path / 'hubroot'), 'TWINKLE_TRUST_REMOTE_CODE': '1'}
    out = run_twinkle(
        'hub',
        'publish',
        str(REPO_ROOT / 'hub' / 'swiglu-kernel'),
        '--repo',
        'hf://me/swiglu',
        '--revision',
        'v2',
        env=env,
    )
    assert out.returncode == 0, out.stderr
    published = tmp_path / 'hubroot' / 'hf' / 'me' / 'swiglu' / 'v2'
    assert file_hashes(published) == file_hashes(REPO_ROOT / 'hub' / 'swiglu-kernel')
    assert '[component.files]' in out.stdout  # the pin printed for registry/ or a lock file
    code = f"""
        from transformers import AutoModelForCausalLM
        from twinkle_core.kernel import apply_kernels
        m = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})
        print(apply_kernels(m, ['hf://me/swiglu@v2:SwiGLUMLP']))
    """
    from core_helpers import run_python

    loaded = run_python(code, env=env, timeout=120)
    layers = hf_model(tiny_model_dir).config.num_hidden_layers
    assert loaded.returncode == 0 and f"{{'SwiGLUMLP': {layers}}}" in loaded.stdout, loaded.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_first_party_kernels_on_a_cuda_model(kernel_cache, tiny_model_dir) -> None:
    """The torch-universal builds resolve and run on CUDA too (same logits and gradients, fp32)."""
    model, reference = hf_model(tiny_model_dir).cuda(), hf_model(tiny_model_dir).cuda()
    assert apply_kernels(model, KERNELS, device='cuda')['RMSNorm'] == 4 * model.config.num_hidden_layers + 1
    ids = IDS.cuda()
    out, ref = model(input_ids=ids, labels=ids), reference(input_ids=ids, labels=ids)
    out.loss.backward(), ref.loss.backward()
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
