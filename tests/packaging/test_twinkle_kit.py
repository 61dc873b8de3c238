"""`pip install twinkle-kit` from wheels built here, into a fresh venv, then a one-step LoRA SFT in it.

The first-party wheels (twinkle-core, the six plugins, the twinkle-kit meta-distribution) are built with
``python -m build --wheel --no-isolation`` from copies of their sources. A venv without system site packages gets
torch (CPU) first, then ``twinkle-kit`` from those wheels (everything else from the package index, pinned by
requirements/constraints.txt). From a directory outside the repository, the venv then imports core, the
Transformers plugin and the client from its own site-packages, finds ``TransformersModel`` through its entry point,
builds the tiny fixture model with the installed ``twinkle`` command, and trains a LoRA adapter one step.
One extra (``[ray]``) is installed for real; the others are checked in the installed kit's metadata.

Expensive (2.5-3.5 min on the 2-core box; marked slow, CI runs it in its slow step): the eight wheel builds
(~10-15 s), the venv with torch and then the kit's requirements (~90-145 s), the tiny model and the SFT step
(~15-20 s), the ``[ray]`` extra (~15-20 s).

NOTE: PyPI has an unrelated ``twinkle-kit`` (the upstream ModelScope project: 0.1 ... 0.5.x; its ``0.1`` equals our
``0.1.0`` for pip), so the kit is installed by its wheel's path, and pip's install report must show every
first-party distribution coming from the wheels built here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO_ROOT / 'requirements' / 'constraints.txt'
KIT = 'twinkle-kit'
# distribution -> source directory (relative to the repository root)
SOURCES = {
    'twinkle-core': '.',
    'twinkle-transformers': 'plugins/transformers',
    'twinkle-client': 'plugins/client',
    'twinkle-megatron': 'plugins/megatron',
    'twinkle-vllm': 'plugins/vllm',
    'twinkle-server': 'plugins/server',
    'twinkle-ray': 'plugins/ray',
    'twinkle-agentic': 'plugins/agentic',
    KIT: 'packages/twinkle-kit',
}
# what `pip install twinkle-kit` must bring (distribution -> its extras), and what each extra adds
BASE = {'twinkle-core': {'torch', 'data', 'hub'}, 'twinkle-transformers': set(), 'twinkle-client': set()}
EXTRAS = {
    'megatron': {'twinkle-megatron'},
    'vllm': {'twinkle-vllm'},
    'server': {'twinkle-server'},
    'ray': {'twinkle-ray'},
    'agentic': {'twinkle-agentic'},
    'all': {'twinkle-megatron', 'twinkle-vllm', 'twinkle-server', 'twinkle-ray', 'twinkle-agentic'},
}
PIP_TIMEOUT = 600
IGNORE = shutil.ignore_patterns('__pycache__', '*.pyc', '*.egg-info', 'build', 'dist')


def pyproject(dist: str) -> dict:
    return tomllib.loads((REPO_ROOT / SOURCES[dist] / 'pyproject.toml').read_text())


def version_of(dist: str) -> str:
    return pyproject(dist)['project']['version']


def run(cmd: list[str], *, timeout: int = PIP_TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f'{" ".join(map(str, cmd))} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}'
    return done


# ---- the wheels ------------------------------------------------------------------------------------------------
def copy_sources(dist: str, dest: Path) -> Path:
    """The files a wheel build reads, without editable-install leftovers (egg-info, build/) of the working tree."""
    src = REPO_ROOT / SOURCES[dist]
    if dist == 'twinkle-core':
        dest.mkdir(parents=True)
        for name in ('pyproject.toml', 'setup.py', 'MANIFEST.in', 'README.md'):
            if (src / name).exists():
                shutil.copy2(src / name, dest / name)
        for folder in ('twinkle_core', 'registry'):
            shutil.copytree(src / folder, dest / folder, ignore=IGNORE)
    else:
        shutil.copytree(src, dest, ignore=IGNORE)
    return dest


@pytest.fixture(scope='module')
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every first-party wheel, built from this tree (expensive: ~10-15 s)."""
    try:
        import build  # noqa: F401
    except ImportError:
        pytest.fail('the `build` package is missing from .venv: it belongs in requirements/test.txt')
    root = tmp_path_factory.mktemp('kit_wheels')
    out = root / 'wheels'
    for dist in SOURCES:
        src = copy_sources(dist, root / 'src' / dist)
        # --skip-dependency-check: the build-system table names `wheel`, which setuptools >= 70.1 no longer needs
        run([sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--skip-dependency-check', '-o', out, src])
    return out


def wheel_of(wheel_dir: Path, dist: str) -> Path:
    found = sorted(wheel_dir.glob(f'{dist.replace("-", "_")}-{version_of(dist)}-*.whl'))
    assert len(found) == 1, f'expected one wheel of {dist} in {sorted(p.name for p in wheel_dir.iterdir())}'
    return found[0]


def dist_info_text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.endswith(f'.dist-info/{name}')), None)
        return zf.read(member).decode() if member else ''


def wheel_entry_points(wheel: Path) -> dict[str, dict[str, str]]:
    groups: dict[str, dict[str, str]] = {}
    group = None
    for line in dist_info_text(wheel, 'entry_points.txt').splitlines():
        line = line.strip()
        if line.startswith('[') and line.endswith(']'):
            group = groups.setdefault(line[1:-1], {})
        elif '=' in line and group is not None:
            name, value = (part.strip() for part in line.split('=', 1))
            group[name] = value
    return groups


def test_versions_move_in_lockstep() -> None:
    """The kit pins every first-party distribution to its own version, and they all share it."""
    kit = version_of(KIT)
    assert {dist: version_of(dist) for dist in SOURCES} == dict.fromkeys(SOURCES, kit)


def test_wheels_carry_entry_points_package_data_and_no_kit_code(wheel_dir: Path) -> None:
    for dist in SOURCES:
        wheel = wheel_of(wheel_dir, dist)
        declared = pyproject(dist)['project'].get('entry-points', {})
        scripts = pyproject(dist)['project'].get('scripts', {})
        expected = {**declared, **({'console_scripts': scripts} if scripts else {})}
        assert wheel_entry_points(wheel) == expected, dist  # the registry finds components by these
    names = zipfile.ZipFile(wheel_of(wheel_dir, 'twinkle-core')).namelist()
    data = sorted(p.name for p in (REPO_ROOT / 'twinkle_core' / 'fixtures' / 'data').iterdir() if p.is_file())
    assert sorted(n.rsplit('/', 1)[1] for n in names if n.startswith('twinkle_core/fixtures/data/')) == data
    static = sorted(p.name for p in (REPO_ROOT / 'twinkle_core' / 'console' / 'static').iterdir() if p.is_file())
    assert sorted(n.rsplit('/', 1)[1] for n in names if n.startswith('twinkle_core/console/static/')) == static
    registry = sorted(p.name for p in (REPO_ROOT / 'registry').glob('*.toml'))
    assert sorted(n.rsplit('/', 1)[1] for n in names if n.startswith('twinkle_core/_registry/')) == registry
    kit_files = zipfile.ZipFile(wheel_of(wheel_dir, KIT)).namelist()
    assert [n for n in kit_files if '.dist-info/' not in n] == []  # a meta-distribution: metadata only


# ---- the fresh venv --------------------------------------------------------------------------------------------
class Venv:
    def __init__(self, root: Path, wheel_dir: Path) -> None:
        self.root = root
        self.dir = root / 'venv'
        self.wheel_dir = wheel_dir
        self.python = self.dir / 'bin' / 'python'
        self.work = root / 'work'  # the cwd of every command: outside the repository
        self.work.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith('TWINKLE_') and k not in ('PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV', 'PYTHONSTARTUP')
        }
        env.update(
            PATH=f'{self.dir / "bin"}{os.pathsep}{env.get("PATH", "")}',
            VIRTUAL_ENV=str(self.dir),
            PYTHONNOUSERSITE='1',
            PIP_DISABLE_PIP_VERSION_CHECK='1',
            HF_HUB_OFFLINE='1',
            TRANSFORMERS_OFFLINE='1',
            HF_DATASETS_OFFLINE='1',
            TWINKLE_HUB_OFFLINE='1',
            TOKENIZERS_PARALLELISM='false',
            HF_HOME=str(root / 'hf_home'),
            TWINKLE_FIXTURES_DIR=str(root / 'fixtures'),
            OMP_NUM_THREADS='1',
        )
        self.env = env

    def create(self) -> None:
        run([sys.executable, '-m', 'venv', self.dir], cwd=self.work)
        # the CPU build of torch first (it lies on this machine's disk): an unpinned torch is a multi-GB CUDA build.
        # Installs here skip byte-compiling every module (--no-compile: ~15 s of CPU for torch alone); what the probes
        # import is compiled when imported.
        self.pip('install', '--no-compile', 'torch==2.13.0')

    def pip(self, *args: str | Path) -> subprocess.CompletedProcess:
        return run([self.python, '-m', 'pip', *args], cwd=self.work, env=self.env)

    def install_kit(self, extras: str = '') -> list[dict]:
        """`pip install twinkle-kit[extras]` from the built wheels; returns pip's report of what it installed."""
        report = self.root / f'report{extras or "-base"}.json'
        # The kit by its wheel's path: PyPI's unrelated twinkle-kit has a release `0.1`, equal to our 0.1.0 for pip.
        # What the kit names (twinkle-core, the plugins: not on PyPI) pip finds by name in --find-links.
        requirement = f'{wheel_of(self.wheel_dir, KIT)}{extras}'
        self.pip(
            'install',
            '-q',
            '--no-compile',
            '-c',
            CONSTRAINTS,
            '--find-links',
            self.wheel_dir,
            '--report',
            report,
            requirement,
        )
        items = json.loads(report.read_text())['install']
        for item in items:
            if item['metadata']['name'].startswith('twinkle-'):
                assert item['download_info']['url'].startswith(self.wheel_dir.as_uri()), item['download_info']
        return items

    def python_json(self, code: str, *args: str, timeout: int = 300) -> dict:
        script = self.work / 'probe.py'
        script.write_text(textwrap.dedent(code))
        done = run([self.python, script, *args], cwd=self.work, env=self.env, timeout=timeout)
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def kit_venv(wheel_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Venv, list[dict]]:
    """A fresh venv with torch, then `pip install twinkle-kit` (expensive: ~1.5-2.5 min)."""
    venv = Venv(tmp_path_factory.mktemp('kit_venv'), wheel_dir)
    venv.create()
    return venv, venv.install_kit()


SITE_AND_MODULES = """
    import importlib, json, sysconfig
    mods = {m: importlib.import_module(m).__file__ for m in ('twinkle_core', 'twinkle_transformers', 'twinkle_client')}
    print(json.dumps({'purelib': sysconfig.get_paths()['purelib'], 'modules': mods}))
"""

REGISTRY_AND_METADATA = """
    import json
    from importlib.metadata import requires
    from twinkle_core.registry import list_components, resolve_class

    cls = resolve_class('model', 'TransformersModel')
    infos = {(c.kind, c.name): c for kind in ('model', 'runtime') for c in list_components(kind)}

    def info(kind, name):
        c = infos.get((kind, name))
        return c and [c.source, c.provider]

    print(json.dumps({
        'TransformersModel': f'{cls.__module__}.{cls.__qualname__}',
        'model/TransformersModel': info('model', 'TransformersModel'),
        'model/MegatronModel': info('model', 'MegatronModel'),
        'runtime/http': info('runtime', 'http'),
        'requires': requires('twinkle-kit'),
    }))
"""


def test_kit_installs_core_transformers_and_client_from_the_wheels(kit_venv) -> None:
    venv, installed = kit_venv
    first_party = {item['metadata']['name'] for item in installed if item['metadata']['name'].startswith('twinkle-')}
    assert first_party == {KIT, *BASE}  # and no other plugin
    names = {canonicalize_name(item['metadata']['name']) for item in installed}
    assert {'datasets', 'tokenizers', 'transformers', 'huggingface-hub', 'modelscope', 'peft'} <= names

    found = venv.python_json(SITE_AND_MODULES)
    purelib = found['purelib']
    assert purelib.startswith(str(venv.dir))
    for module, path in found['modules'].items():
        assert path.startswith(purelib), f'{module} imported from {path}, not from the fresh venv'
        assert not path.startswith(str(REPO_ROOT))


def test_registry_finds_plugins_by_entry_point_and_kit_declares_extras(kit_venv) -> None:
    venv, _ = kit_venv
    found = venv.python_json(REGISTRY_AND_METADATA)
    assert found['TransformersModel'] == 'twinkle_transformers.model.TransformersModel'
    assert found['model/TransformersModel'] == ['entry_point', 'twinkle-transformers']
    assert found['runtime/http'] == ['entry_point', 'twinkle-client']
    # not installed: known only to the registry/ index shipped in the core wheel
    assert found['model/MegatronModel'] is not None and found['model/MegatronModel'][0] == 'index'

    version = version_of(KIT)
    base: dict[str, set[str]] = {}
    extras: dict[str, set[str]] = {}
    for line in found['requires']:
        req = Requirement(line)
        assert str(req.specifier) == f'=={version}', line
        extra = next((e for e in EXTRAS if req.marker and req.marker.evaluate({'extra': e})), None)
        if extra is None:
            assert req.marker is None, line
            base[req.name] = set(req.extras)
        else:
            assert [e for e in EXTRAS if req.marker.evaluate({'extra': e})] == [extra], line
            extras.setdefault(extra, set()).add(req.name)
    assert base == BASE
    assert extras == EXTRAS


SFT = """
    import json, math, sys
    import torch
    import twinkle_core
    from twinkle_core.dataset import Dataset, DatasetMeta
    from twinkle_core.fixtures import data_path
    from twinkle_core.registry import resolve

    model_dir = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    twinkle_core.initialize(mode='local')
    # a few rows of the self-cognition data shipped in the core wheel -> chat messages -> ids + assistant labels
    dataset = Dataset(DatasetMeta(str(data_path('self_cognition.jsonl'))))
    dataset.map('SelfCognitionProcessor', init_args={'model_name': 'Twinkle', 'model_author': 'ModelScope'})
    dataset.set_template('Template', model_id=model_dir, max_length=256)
    dataset.encode()
    rows = dataset.rows(list(range(4)))

    model = resolve('model', 'TransformersModel', model_id=model_dir)  # by name: the plugin's entry point
    model.add_adapter_to_model('default', {'r': 4, 'lora_alpha': 8, 'target_modules': 'all-linear'})
    model.set_template('Template')
    model.set_optimizer('AdamW', lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.model.named_parameters() if p.requires_grad}
    out = model.forward_backward(inputs=rows)
    model.clip_grad_and_step(max_norm=1.0)
    after = dict(model.model.named_parameters())
    changed = sorted(n for n, p in before.items() if not torch.equal(p, after[n].detach()))
    twinkle_core.shutdown()
    print(json.dumps({
        'loss': float(out['loss']),
        'trainable': sorted(before),
        'changed': changed,
        'finite': all(bool(torch.isfinite(after[n]).all()) for n in before),
    }))
"""


def test_one_step_lora_sft_in_the_fresh_venv(kit_venv) -> None:
    venv, _ = kit_venv
    model_dir = venv.root / 'tiny-model'
    run([venv.dir / 'bin' / 'twinkle', 'fixtures', 'tiny-model', model_dir], cwd=venv.work, env=venv.env, timeout=300)
    assert (model_dir / 'twinkle_fixture.json').is_file()
    found = venv.python_json(SFT, str(model_dir))
    assert 0 < found['loss'] < 100 and found['finite'], found
    assert found['trainable'] and all('lora_' in n for n in found['trainable'])
    assert any('lora_B' in n for n in found['changed']), found['changed']  # the adapter was trained


RAY = """
    import json
    import twinkle_ray
    from twinkle_core.registry import list_components, resolve_class

    cls = resolve_class('runtime', 'ray')
    info = next(c for c in list_components('runtime') if c.name == 'ray')
    print(json.dumps({'file': twinkle_ray.__file__, 'ray': cls.__module__, 'source': [info.source, info.provider]}))
"""


def test_ray_extra_installs_its_plugin(kit_venv) -> None:
    """`twinkle-kit[ray]` adds exactly twinkle-ray (and Ray) to the base install (expensive: ~20 s)."""
    venv, _ = kit_venv
    installed = venv.install_kit('[ray]')
    first_party = {item['metadata']['name'] for item in installed if item['metadata']['name'].startswith('twinkle-')}
    assert first_party == {'twinkle-ray'}
    assert 'ray' in {canonicalize_name(item['metadata']['name']) for item in installed}
    found = venv.python_json(RAY)
    assert found['file'].startswith(str(venv.dir))
    assert found['ray'] == 'twinkle_ray.runtime'
    assert found['source'] == ['entry_point', 'twinkle-ray']
