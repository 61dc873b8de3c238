"""Hub component integrity: what the sha256 pin covers, and bytecode that is refused, never run, never written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from core_helpers import PATCH_HF, PATCH_MS, PATCH_REPO, loss_repo, run_python, write_repo

from twinkle_core import resolve
from twinkle_core.errors import HubError, IntegrityError
from twinkle_core.hub import folder_sha256
from twinkle_core.hub.integrity import bytecode_files, hashed_files


def test_folder_sha256_is_deterministic_and_ignores_caches(tmp_path: Path) -> None:
    a = loss_repo(tmp_path / 'a', 'x')
    b = loss_repo(tmp_path / 'b', 'x')
    assert folder_sha256(a) == folder_sha256(b)
    (b / '__pycache__').mkdir()
    (b / '__pycache__' / 'loss.cpython-311.pyc').write_bytes(b'junk')
    (b / '.cache').mkdir()
    (b / '.cache' / 'meta').write_text('client metadata')
    assert folder_sha256(a) == folder_sha256(b)
    assert bytecode_files(b) == ['__pycache__/loss.cpython-311.pyc'] and bytecode_files(a) == []
    assert hashed_files(a) == hashed_files(b) == ['helpers.py', 'loss.py', 'twinkle.toml']
    (b / 'loss.py').write_text((b / 'loss.py').read_text() + '\n# changed\n')
    assert folder_sha256(a) != folder_sha256(b)
    (b / 'loss.py').rename(b / 'loss2.py')  # same bytes, other path -> other hash
    assert folder_sha256(a) != folder_sha256(b)


def test_bytecode_is_listed_and_everything_else_importable_is_hashed(tmp_path: Path) -> None:
    a = loss_repo(tmp_path / 'a', 'x')
    sha = folder_sha256(a)
    for rel in ('ghost.pyc', 'sub/old.pyo', 'sub/__pycache__/notes.txt', '__pycache__/x.cpython-311.pyc'):
        (a / rel).parent.mkdir(parents=True, exist_ok=True)
        (a / rel).write_bytes(b'junk')
    (a / '.git').mkdir()
    (a / '.git' / 'x.pyc').write_bytes(b'not importable: no module name starts with "."')
    assert bytecode_files(a) == [
        '__pycache__/x.cpython-311.pyc',
        'ghost.pyc',
        'sub/__pycache__/notes.txt',
        'sub/old.pyo',
    ]
    assert folder_sha256(a) == sha  # bytecode is not part of the pin (the loader refuses it instead)
    (a / 'native.cpython-311-x86_64-linux-gnu.so').write_bytes(b'\x7fELF')  # importable: covered by the pin
    (a / 'data.bin').write_bytes(b'')
    assert {'native.cpython-311-x86_64-linux-gnu.so', 'data.bin'} <= set(hashed_files(a))
    assert folder_sha256(a) != sha


def plant_bytecode(source: Path, code: str) -> Path:
    """Write the bytecode of `code` where Python looks for `source`'s cache, as an unchecked-hash pyc: the
    default loader would run it instead of `source` without even looking at the source."""
    import importlib.util
    import py_compile

    pyc = Path(importlib.util.cache_from_source(str(source)))
    evil = source.parent.parent / f'evil-{source.name}'
    evil.write_text(code)
    pyc.parent.mkdir(exist_ok=True)
    py_compile.compile(
        str(evil),
        cfile=str(pyc),
        dfile=str(source),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    evil.unlink()
    return pyc


@pytest.mark.parametrize('scheme', ['hf', 'ms'])
def test_pinned_component_with_planted_bytecode_is_refused(scheme: str, publish_to_cache, tmp_path: Path) -> None:
    repo = PATCH_HF if scheme == 'hf' else PATCH_MS
    snapshot = publish_to_cache(f'{repo}@v0.1.0', PATCH_REPO)
    pyc = plant_bytecode(snapshot / 'rmsnorm.py', 'raise SystemExit("planted bytecode ran")\n')
    rel = pyc.relative_to(snapshot).as_posix()
    assert folder_sha256(snapshot) == folder_sha256(PATCH_REPO)  # the pin alone would not notice it
    for trust in (None, True):  # trusting does not override the check
        with pytest.raises(IntegrityError, match='bytecode') as info:
            resolve('patch', f'{repo}@v0.1.0:Qwen3RMSNormFP32', trust_remote_code=trust)
        assert rel in str(info.value) and str(snapshot) in str(info.value)
    pyc.unlink()
    (snapshot / 'rmsnorm.pyc').write_bytes(pyc.name.encode())  # a sourceless module is bytecode too
    with pytest.raises(IntegrityError, match='rmsnorm.pyc'):
        resolve('patch', f'{repo}@v0.1.0:Qwen3RMSNormFP32')
    (snapshot / 'rmsnorm.pyc').unlink()
    pyc.parent.rmdir()
    assert type(resolve('patch', f'{repo}@v0.1.0:Qwen3RMSNormFP32')).__name__ == 'Qwen3RMSNormFP32Patch'


LAZY_REPO = {
    'twinkle.toml': 'name = "LazyLoss"\nkind = "loss"\nentry = "loss:LazyLoss"\n',
    'loss.py': """
        from twinkle_core.loss import Loss
        from .helpers import TAG

        class LazyLoss(Loss):
            tag = TAG
            def __call__(self, inputs, outputs, **kwargs):
                from .inner import lazy  # imported only when called, long after verification
                return {'loss': lazy.VALUE}
    """,
    'helpers.py': 'TAG = "source"\n',
    'inner/__init__.py': '',
    'inner/lazy.py': 'VALUE = 42\n',
}


def pycache_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob('__pycache__'))


def test_verified_component_loads_without_writing_bytecode_and_loads_twice(
    publish_to_cache, tmp_path: Path, registry_dir, monkeypatch
) -> None:
    from twinkle_core.hub import loader

    monkeypatch.setattr(sys, 'dont_write_bytecode', False)  # what a plain `python train.py` does
    src = write_repo(tmp_path / 'lazy', LAZY_REPO)
    snapshot = publish_to_cache('ms://someone/lazy@r1', src)
    registry_dir(f'''
        [[component]]
        name = "LazyLoss"
        kind = "loss"
        hub = "ms://someone/lazy"
        revision = "r1"
        sha256 = "{folder_sha256(src)}"
    ''')
    loss = resolve('loss', 'LazyLoss')
    assert loss.tag == 'source' and pycache_dirs(snapshot) == []
    assert loss([1], {}) == {'loss': 42} and pycache_dirs(snapshot) == []  # the lazy import wrote nothing either
    assert type(resolve('loss', 'LazyLoss')) is type(loss)  # verified again (and still matching), then cached
    # A fresh import of the same verified folder (as the next process would do) verifies and loads again.
    package = type(loss).__module__.rpartition('.')[0]
    for name in [m for m in sys.modules if m == package or m.startswith(package + '.')]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(loader, '_cache', {})
    again = resolve('loss', 'LazyLoss')
    assert type(again) is not type(loss) and again([1], {}) == {'loss': 42} and pycache_dirs(snapshot) == []
    code = "from twinkle_core import resolve; print(resolve('loss', 'LazyLoss')([1], {})['loss'])"
    for _ in range(2):  # two processes in a row: the first must not leave anything that fails the second
        done = run_python(code, env={'PYTHONDONTWRITEBYTECODE': ''})
        assert done.returncode == 0 and done.stdout.strip() == '42', done.stderr
    assert pycache_dirs(snapshot) == []


def test_hub_imports_never_read_bytecode(tmp_path: Path) -> None:
    """Bytecode planted after verification (or in a folder imported directly) is never used: hub modules are
    always compiled from their source, and a sourceless *.pyc is not importable."""
    from twinkle_core.hub.importer import import_entry

    folder = write_repo(tmp_path / 'lazy', LAZY_REPO)
    plant_bytecode(folder / 'helpers.py', 'TAG = "planted"\n')
    plant_bytecode(folder / 'inner' / 'lazy.py', 'VALUE = -1\n')
    ghost = folder / 'ghost.pyc'
    plant_bytecode(tmp_path / 'ghost.py', 'class X: pass\n').rename(ghost)
    before = sorted(p.relative_to(folder) for p in folder.rglob('*'))
    package = '_twinkle_test_no_bytecode'
    try:
        cls = import_entry(package, folder, 'loss:LazyLoss', 'test')
        assert cls.tag == 'source' and cls()([1], {}) == {'loss': 42}
        with pytest.raises(HubError, match="entry module 'ghost' not found"):
            import_entry(package, folder, 'ghost:X', 'test')
        with pytest.raises(HubError, match='not found'):
            import_entry(package, folder, '__pycache__:X', 'test')
    finally:
        for name in [m for m in sys.modules if m == package or m.startswith(package + '.')]:
            del sys.modules[name]
    assert sorted(p.relative_to(folder) for p in folder.rglob('*')) == before  # nothing written
