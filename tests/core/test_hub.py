"""Hub components offline, through the real huggingface_hub / modelscope download code (pre-populated caches,
offline mode): references, manifests, trust, sha256 pins, unique module names, publish/pull."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from core_helpers import PATCH_HF, PATCH_MS, PATCH_REPO, loss_repo, run_twinkle, write_repo

from twinkle_core import resolve
from twinkle_core.errors import HubError, IntegrityError, UntrustedRemoteCodeError
from twinkle_core.hub import HubRef, folder_sha256, read_manifest
from twinkle_core.hub.integrity import hashed_files
from twinkle_core.hub.loader import load_hub_component


# ---- references and manifests ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'text, expected',
    [
        ('ms://org/repo', HubRef('ms', 'org', 'repo')),
        ('hf://Org-1/re.po_2@v1.0:MyLoss', HubRef('hf', 'Org-1', 're.po_2', 'v1.0', 'MyLoss')),
        ('ms://org/repo:Name', HubRef('ms', 'org', 'repo', None, 'Name')),
        ('hf://org/repo@refs/pr/1', HubRef('hf', 'org', 'repo', 'refs/pr/1', None)),
    ],
)
def test_hubref_parses(text: str, expected: HubRef) -> None:
    assert HubRef.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    'text, fragment',
    [
        ('gh://org/repo', 'must start with ms:// or hf://'),
        ('ms://repo', 'is not "org/repo"'),
        ('ms://org/repo/extra', 'is not "org/repo"'),
        ('ms://org/repo@', 'revision'),
        ('ms://org/repo@v1/../../etc', 'revision'),
        ('hf://org/repo@v1:', 'component name'),
        ('hf://org/repo:1bad', 'component name'),
    ],
)
def test_hubref_errors_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(HubError, match='form') as info:
        HubRef.parse(text)
    assert fragment in str(info.value)


def test_manifest_several_components_and_errors(tmp_path: Path) -> None:
    repo = write_repo(
        tmp_path / 'multi',
        {
            'twinkle.toml': """
        version = "1.0"
        [[component]]
        name = "A"
        kind = "loss"
        entry = "a:A"
        [[component]]
        name = "B"
        kind = "loss"
        entry = "pkg.b:B"
        requires = ["definitely-not-installed-dist>=1"]
    """
        },
    )
    manifest = read_manifest(repo)
    assert [(c.name, c.version, c.module) for c in manifest.components] == [('A', '1.0', 'a'), ('B', '1.0', 'pkg.b')]
    with pytest.raises(HubError, match='several loss components'):
        manifest.select('loss', None, 'x')
    with pytest.raises(HubError, match='is a loss, not a patch'):
        manifest.select('patch', 'A', 'x')
    bad = write_repo(tmp_path / 'bad', {'twinkle.toml': 'name = "X"\nkind = "losss"\nentry = "a:X"\n'})
    with pytest.raises(HubError, match="kind 'losss' is not one of"):
        read_manifest(bad)
    with pytest.raises(HubError, match='has no twinkle.toml'):
        read_manifest(tmp_path)


def test_shipped_pin_matches_hub_folder() -> None:
    """registry/hub.toml pins exactly the files in hub/qwen3-training-patches (re-pin with `twinkle hub hash`)."""
    from twinkle_core import registry_index

    pins = [e for e in registry_index.entries('patch') if e.hub in (PATCH_MS, PATCH_HF)]
    assert {e.hub for e in pins} == {PATCH_MS, PATCH_HF}
    sha = folder_sha256(PATCH_REPO)
    assert all(e.sha256 == sha and e.revision == 'v0.1.0' for e in pins)
    out = run_twinkle('hub', 'hash', str(PATCH_REPO))
    assert out.returncode == 0 and out.stdout.split()[0] == sha


# ---- loading through the real hub clients, offline --------------------------------------------------------------
@pytest.mark.parametrize('scheme', ['hf', 'ms'])
def test_pinned_patch_loads_offline_without_trust(scheme: str, publish_to_cache) -> None:
    repo = PATCH_HF if scheme == 'hf' else PATCH_MS
    snapshot = publish_to_cache(f'{repo}@v0.1.0', PATCH_REPO)
    patch = resolve('patch', f'{repo}@v0.1.0:Qwen3RMSNormFP32')
    from twinkle_core.patch import Patch

    assert isinstance(patch, Patch) and type(patch).__name__ == 'Qwen3RMSNormFP32Patch'
    module = sys.modules[type(patch).__module__]
    assert module.__name__.startswith(f'_twinkle_hub_{scheme}_twinkle_community_qwen3_training_patches_v0_1_0_')
    assert Path(module.__file__).parent.resolve() == snapshot.resolve() or scheme == 'hf'
    # Without a revision the pinned one is used; the bare name resolves through registry/ (step 3).
    assert type(resolve('patch', f'{repo}:Qwen3RMSNormFP32')) is type(patch)
    if scheme == 'ms':
        assert type(resolve('patch', 'Qwen3RMSNormFP32')) is type(patch)


def test_pinned_component_with_altered_files_is_refused(publish_to_cache, tmp_path: Path) -> None:
    altered = tmp_path / 'altered'
    shutil.copytree(PATCH_REPO, altered)
    (altered / 'rmsnorm.py').write_text((altered / 'rmsnorm.py').read_text() + '\nimport os  # injected\n')
    publish_to_cache(f'{PATCH_MS}@v0.1.0', altered)
    with pytest.raises(IntegrityError, match='sha256') as info:
        resolve('patch', f'{PATCH_MS}@v0.1.0:Qwen3RMSNormFP32')
    assert 'pins' in str(info.value)
    with pytest.raises(IntegrityError):  # trusting does not override a pin
        resolve('patch', f'{PATCH_MS}@v0.1.0:Qwen3RMSNormFP32', trust_remote_code=True)


@pytest.mark.parametrize('scheme', ['hf', 'ms'])
def test_unpinned_component_needs_trust(scheme: str, publish_to_cache, tmp_path: Path, monkeypatch) -> None:
    src = loss_repo(tmp_path / 'src', f'trust-{scheme}')
    publish_to_cache(f'{scheme}://someone/echo@v1', src)
    ref = f'{scheme}://someone/echo@v1:EchoLoss'
    with pytest.raises(UntrustedRemoteCodeError, match='trust_remote_code=True'):
        resolve('loss', ref)
    loss = resolve('loss', ref, trust_remote_code=True)
    assert type(loss).__name__ == 'EchoLoss' and loss.tag == f'trust-{scheme}'  # relative import worked
    assert loss([1], {}) == {'loss': [1]}
    monkeypatch.setenv('TWINKLE_TRUST_REMOTE_CODE', '1')
    assert type(resolve('loss', ref)) is type(loss)
    with pytest.raises(UntrustedRemoteCodeError):  # an explicit False beats the environment
        load_hub_component('loss', ref, trust_remote_code=False)


def test_same_file_names_load_as_different_classes(publish_to_cache, tmp_path: Path) -> None:
    publish_to_cache('hf://alice/echo@v1', loss_repo(tmp_path / 'alice', 'alice'))
    publish_to_cache('hf://bob/echo@v1', loss_repo(tmp_path / 'bob', 'bob'))
    publish_to_cache('ms://alice/echo@v1', loss_repo(tmp_path / 'alice-ms', 'alice'))
    a = load_hub_component('loss', 'hf://alice/echo@v1:EchoLoss', trust_remote_code=True)
    b = load_hub_component('loss', 'hf://bob/echo@v1:EchoLoss', trust_remote_code=True)
    c = load_hub_component('loss', 'ms://alice/echo@v1', trust_remote_code=True)  # only loss in the repo
    assert len({a, b, c}) == 3
    assert (a.tag, b.tag, c.tag) == ('alice', 'bob', 'alice')
    assert len({a.__module__, b.__module__, c.__module__}) == 3
    assert not any(m.endswith('__init__') or m in ('loss', 'helpers') for m in (a.__module__, b.__module__))
    assert 'loss' not in sys.modules and 'helpers' not in sys.modules
    assert str(tmp_path) not in ' '.join(sys.path)


def test_hub_errors_are_actionable(publish_to_cache, tmp_path: Path, registry_dir) -> None:
    with pytest.raises(HubError, match='offline'):
        load_hub_component('loss', 'hf://nobody/missing@v1', trust_remote_code=True)
    with pytest.raises(HubError, match='offline'):
        load_hub_component('loss', 'ms://nobody/missing@v1', trust_remote_code=True)
    src = write_repo(
        tmp_path / 'req',
        {
            'twinkle.toml': 'name = "R"\nkind = "loss"\nentry = "r:R"\nrequires = ["twinkle-nope-dist>=2"]\n',
            'r.py': 'raise SystemExit("must not run")\n',
        },
    )
    publish_to_cache('hf://someone/req@v1', src)
    with pytest.raises(HubError, match='pip install "twinkle-nope-dist>=2"'):
        load_hub_component('loss', 'hf://someone/req@v1', trust_remote_code=True)
    with pytest.raises(HubError, match="no component named 'Nope'"):
        load_hub_component('loss', 'hf://someone/req@v1:Nope', trust_remote_code=True)
    # A pin in a custom index: matching files load without trust.
    sha = folder_sha256(loss_repo(tmp_path / 'p', 'pinned'))
    publish_to_cache('ms://someone/pinned@r1', tmp_path / 'p')
    registry_dir(f'''
        [[component]]
        name = "EchoLoss"
        kind = "loss"
        hub = "ms://someone/pinned"
        revision = "r1"
        sha256 = "{sha}"
    ''')
    assert resolve('loss', 'EchoLoss').tag == 'pinned'


# ---- the shipped patch does what it says -----------------------------------------------------------------------
def test_qwen3_rmsnorm_fp32_patch_on_tiny_qwen3(publish_to_cache) -> None:
    torch = pytest.importorskip('torch')
    transformers = pytest.importorskip('transformers')
    publish_to_cache(f'{PATCH_MS}@v0.1.0', PATCH_REPO)
    patch = resolve('patch', 'Qwen3RMSNormFP32')
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
    )
    model = transformers.Qwen3ForCausalLM(config)
    norm = model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    model = model.to(torch.bfloat16)
    x = torch.randn(4, 16, 64).to(torch.bfloat16)
    xf = x.float()
    reference = norm.weight.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    reference = reference.to(torch.bfloat16)
    before = norm(x)
    assert not torch.equal(before, reference)  # stock Qwen3RMSNorm rounds twice in bf16
    patched = patch.apply(model)
    assert len(patched) == 2 * 4 + 1  # per layer: input/post-attention norms, q_norm, k_norm; plus the final norm
    assert torch.equal(norm(x), reference)
    ids = torch.randint(0, 256, (2, 8))
    assert torch.isfinite(model(input_ids=ids).logits.float()).all()
    patch.revert(model)
    assert torch.equal(norm(x), before)


# ---- publish / pull / hash (local hub root) ---------------------------------------------------------------------
def test_publish_pull_and_load_via_local_hub_root(tmp_path: Path) -> None:
    src = loss_repo(tmp_path / 'src', 'published')
    (src / '__pycache__').mkdir()
    (src / '__pycache__' / 'x.pyc').write_bytes(b'junk')
    env = {'TWINKLE_HUB_ROOT': str(tmp_path / 'hubroot')}
    out = run_twinkle('hub', 'publish', str(src), '--repo', 'ms://me/echo', '--revision', 'v2', env=env)
    assert out.returncode == 0, out.stderr
    sha = folder_sha256(src)
    assert f'sha256 = "{sha}"' in out.stdout and 'revision = "v2"' in out.stdout and 'name = "EchoLoss"' in out.stdout
    dest = tmp_path / 'hubroot' / 'ms' / 'me' / 'echo' / 'v2'
    assert (dest / 'loss.py').is_file() and not (dest / '__pycache__').exists()
    pulled = run_twinkle('hub', 'pull', 'ms://me/echo@v2', env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert sha in pulled.stdout and 'pinned: no' in pulled.stdout and 'EchoLoss' in pulled.stdout
    code = (
        'from twinkle_core import resolve; '
        "print(resolve('loss', 'ms://me/echo@v2:EchoLoss', trust_remote_code=True).tag)"
    )
    import os
    import subprocess

    done = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )
    assert done.stdout.strip() == 'published', done.stderr
    bad = run_twinkle('hub', 'publish', str(tmp_path), '--repo', 'ms://me/echo', env=env)
    assert bad.returncode == 1 and 'has no twinkle.toml' in bad.stderr


def test_subpackages_init_and_import_errors(publish_to_cache, tmp_path: Path) -> None:
    src = write_repo(
        tmp_path / 'pkg',
        {
            'twinkle.toml': """
            [[component]]
            name = "Deep"
            kind = "loss"
            entry = "inner.deep:Deep"
            [[component]]
            name = "NoModule"
            kind = "loss"
            entry = "missing:X"
            [[component]]
            name = "NoAttr"
            kind = "loss"
            entry = "inner.deep:Nope"
            [[component]]
            name = "Raises"
            kind = "loss"
            entry = "boom:X"
        """,
            '__init__.py': 'ROOT_MARK = "root"\n',
            'inner/__init__.py': '',
            'inner/deep.py': 'from .. import ROOT_MARK\nclass Deep:\n    mark = ROOT_MARK\n',
            'boom.py': 'raise RuntimeError("import-time failure")\n',
        },
    )
    publish_to_cache('hf://someone/pkg@v1', src)
    assert load_hub_component('loss', 'hf://someone/pkg@v1:Deep', trust_remote_code=True).mark == 'root'
    with pytest.raises(HubError, match="entry module 'missing' not found"):
        load_hub_component('loss', 'hf://someone/pkg@v1:NoModule', trust_remote_code=True)
    with pytest.raises(HubError, match="has no attribute 'Nope'"):
        load_hub_component('loss', 'hf://someone/pkg@v1:NoAttr', trust_remote_code=True)
    with pytest.raises(HubError, match='RuntimeError: import-time failure'):
        load_hub_component('loss', 'hf://someone/pkg@v1:Raises', trust_remote_code=True)


def test_publish_calls_the_real_upload_apis(tmp_path: Path, monkeypatch) -> None:
    """Without TWINKLE_HUB_ROOT, publish goes through HfApi / modelscope HubApi (recorded here, no network)."""
    import types

    import huggingface_hub

    from twinkle_core.hub.publish import IGNORE, publish

    monkeypatch.delenv('TWINKLE_HUB_ROOT', raising=False)
    src = loss_repo(tmp_path / 'src', 'up')
    calls = []

    def recorder(tag):
        return lambda self, repo_id, **kw: calls.append((tag, repo_id, kw))

    (src / '__pycache__').mkdir()
    (src / '__pycache__' / 'loss.cpython-311.pyc').write_bytes(b'junk')
    (src / '.cache').mkdir()
    (src / '.cache' / 'meta').write_text('client metadata')
    (src / 'stray.pyc').write_bytes(b'junk')
    uploaded = []  # the files each upload call saw: exactly what the pin covers

    def files_of(folder: str) -> list[str]:
        return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob('*') if p.is_file())

    monkeypatch.setattr(huggingface_hub.HfApi, 'create_repo', recorder('hf-create'))
    monkeypatch.setattr(huggingface_hub.HfApi, 'create_branch', recorder('hf-branch'))

    def hf_upload(self, **kw):
        calls.append(('hf-upload', kw['repo_id'], kw))
        uploaded.append(files_of(kw['folder_path']))
        return types.SimpleNamespace(oid='a' * 40, commit_url='https://huggingface.co/me/echo/commit/aaa')

    monkeypatch.setattr(huggingface_hub.HfApi, 'upload_folder', hf_upload)
    done = publish(src, 'hf://me/echo', revision='v1')
    assert done.revision == 'a' * 40 and done.sha256 == folder_sha256(src)  # pins the immutable commit
    assert [c[0] for c in calls] == ['hf-create', 'hf-branch', 'hf-upload']
    assert calls[1][2]['branch'] == 'v1' and calls[2][2]['revision'] == 'v1'
    assert calls[2][2]['ignore_patterns'] == IGNORE
    assert uploaded == [hashed_files(src)] == [['helpers.py', 'loss.py', 'twinkle.toml']]

    class FakeMsApi:  # stands in for modelscope.hub.api.HubApi (whose import pulls in torch)
        def create_repo(self, repo_id, **kw):
            calls.append(('ms-create', repo_id, kw))

        def upload_folder(self, repo_id, folder_path=None, **kw):
            calls.append(('ms-upload', repo_id, {'folder_path': folder_path, **kw}))
            uploaded.append(files_of(folder_path))

    monkeypatch.setitem(sys.modules, 'modelscope.hub.api', types.SimpleNamespace(HubApi=FakeMsApi))
    calls.clear()
    done = publish(src, 'ms://me/echo')
    assert done.revision == 'master'
    assert calls[0] == ('ms-create', 'me/echo', {'exist_ok': True})
    assert calls[1][2]['revision'] == 'master' and uploaded[-1] == hashed_files(src)
    assert not Path(calls[1][2]['folder_path']).exists()  # the staging copy is gone
    with pytest.raises(HubError, match='not a component name'):
        publish(src, 'ms://me/echo:EchoLoss')


def test_several_pinned_revisions_need_an_explicit_one(registry_dir) -> None:
    registry_dir("""
        [[component]]
        name = "A"
        kind = "loss"
        hub = "hf://org/two"
        revision = "v1"
        sha256 = "0000000000000000000000000000000000000000000000000000000000000001"
        [[component]]
        name = "A"
        kind = "loss"
        hub = "hf://org/two"
        revision = "v2"
        sha256 = "0000000000000000000000000000000000000000000000000000000000000002"
    """)
    from twinkle_core.hub.loader import find_pin

    with pytest.raises(HubError, match=r'several revisions \(v1, v2\)'):
        find_pin(HubRef.parse('hf://org/two:A'))
    assert find_pin(HubRef.parse('hf://org/two@v2:A')).sha256.endswith('2')
    assert find_pin(HubRef.parse('hf://org/two@v3:A')) is None
