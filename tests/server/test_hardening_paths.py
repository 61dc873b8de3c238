"""Files a client can make the server read: a hub id never resolves to a local path, every source that touches the
disk stays inside the allowed roots (symlinks followed), bare names in native calls are checked like paths, and
`data_slice` bounds are checked before anything the size of the slice is built."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import psutil
import pytest
from raw_http import assert_refused
from server_names import MODEL

SECRET = 'TOP-SECRET-ROW'


@pytest.fixture()
def native(server, alice):
    with httpx.Client(base_url=server.base_url + '/twinkle/v1', headers={'X-API-Key': alice}, timeout=120) as client:
        yield client


@pytest.fixture()
def layout(tmp_path, monkeypatch, server) -> Path:
    """The server's working directory `cwd` holds secrets next to the allowed root ``cwd/allowed``:

    cwd/secretdir/s.jsonl, cwd/secretdir/sub/s.jsonl, x/s.jsonl (= cwd/../x)     secret rows
    cwd/allowed/data.jsonl (3 rows), cwd/allowed/good/a.jsonl                      legitimate data
    cwd/allowed/link.jsonl -> secret file, cwd/allowed/linkdir -> secretdir       symlinks out of the root
    cwd/allowed/mixed/{a.jsonl, b.jsonl -> secret file}                           a directory leaking one file
    """
    cwd = tmp_path / 'cwd'
    secret_row = json.dumps({'messages': [{'role': 'user', 'content': SECRET}]}) + '\n'
    for secret in (cwd / 'secretdir' / 's.jsonl', cwd / 'secretdir' / 'sub' / 's.jsonl', tmp_path / 'x' / 's.jsonl'):
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(secret_row)
    allowed = cwd / 'allowed'
    (allowed / 'good').mkdir(parents=True)
    (allowed / 'mixed').mkdir()
    (allowed / 'data.jsonl').write_text(
        ''.join(json.dumps({'messages': [{'role': 'user', 'content': f'row {i}'}]}) + '\n' for i in range(3))
    )
    shutil.copy(allowed / 'data.jsonl', allowed / 'good' / 'a.jsonl')
    shutil.copy(allowed / 'data.jsonl', allowed / 'mixed' / 'a.jsonl')
    (allowed / 'link.jsonl').symlink_to(cwd / 'secretdir' / 's.jsonl')
    (allowed / 'linkdir').symlink_to(cwd / 'secretdir')
    (allowed / 'mixed' / 'b.jsonl').symlink_to(cwd / 'secretdir' / 's.jsonl')
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(server.service.config, 'allowed_roots', (str(allowed),))
    return cwd


def _dataset(native: httpx.Client, source: str, data_slice: object = None, steps: list | None = None) -> httpx.Response:
    meta = {'dataset_id_or_path': source} | ({'data_slice': data_slice} if data_slice is not None else {})
    return native.post('/datasets', json={'meta': meta, 'steps': steps or []})


# ---- 1. hub ids are hub ids; local sources stay inside the allowed roots ---------------------------------------------
@pytest.mark.parametrize(
    'source, status, needle',
    [
        ('hf://secretdir/.', 400, 'org/name'),
        ('ms://secretdir/.', 400, 'org/name'),
        ('hf://secretdir', 400, 'org/name'),
        ('hf://../x', 400, 'org/name'),
        ('hf://secretdir/sub', 400, 'exists on this server'),  # the org/name form, but a local directory
        ('ms://secretdir/sub', 400, 'exists on this server'),
        ('allowed/link.jsonl', 403, 'not from another path on the server'),  # symlinks out of the allowed root
        ('allowed/linkdir', 403, 'not from another path on the server'),
        ('allowed/mixed', 403, 'not from another path on the server'),
        ('allowed/data.jsonl\x00', 403, 'not from another path on the server'),  # unresolvable: refused, no 5xx
        ('file://secretdir/s.jsonl', 400, 'ms://'),
    ],
)
def test_a_dataset_source_never_reads_outside_the_allowed_roots(layout, native, source, status, needle):
    r = _dataset(native, source)
    assert SECRET not in r.text, (r.status_code, r.text[:300])
    assert_refused(r, status, needle)


def test_a_dataset_under_the_allowed_root_still_loads(layout, native):
    for source in ('allowed/data.jsonl', str(layout / 'allowed' / 'data.jsonl'), 'allowed/good'):
        r = _dataset(native, source)
        assert r.status_code == 200, r.text
        assert [row['messages'][0]['content'] for row in r.json()['rows']] == ['row 0', 'row 1', 'row 2']


def test_the_core_loader_refuses_a_hub_id_that_names_a_local_path(layout):
    from twinkle_core.dataset import Dataset, DatasetMeta
    from twinkle_core.errors import InvalidInputError

    for source in ('hf://secretdir/.', 'ms://secretdir/.', 'hf://../x', 'hf://secretdir/sub@main'):
        with pytest.raises(InvalidInputError, match='org/name|exists on this server'):
            Dataset(DatasetMeta(source))


# ---- 2. data_slice: bounds checked arithmetically, before anything is built ------------------------------------------
@pytest.mark.parametrize(
    'data_slice, status, needle',
    [
        ({'start': 0, 'stop': 50_000_000}, 422, 'the data set has 3 rows'),
        ({'start': 0, 'stop': 10**18, 'step': 10**17}, 422, 'the data set has 3 rows'),
        ({'start': -50_000_000, 'stop': 0}, 422, 'the data set has 3 rows'),
        ({'start': 50_000_000, 'stop': 0, 'step': -1}, 422, 'the data set has 3 rows'),
        ({'start': 0, 'stop': 2, 'step': 0}, 400, 'data_slice.step'),
        ({'start': 0}, 400, 'data_slice.stop'),
        ({'start': 'a', 'stop': 2}, 400, 'data_slice.start'),
        (-1, 400, 'data_slice'),
        ('all', 400, 'data_slice'),
    ],
)
def test_an_out_of_range_data_slice_is_refused_at_once(layout, native, data_slice, status, needle):
    rss = psutil.Process().memory_info().rss
    start = time.monotonic()
    r = _dataset(native, 'allowed/data.jsonl', data_slice)
    elapsed = time.monotonic() - start
    assert_refused(r, status, needle)
    assert elapsed < 2.0, f'{elapsed:.1f} s'
    assert psutil.Process().memory_info().rss - rss < 100 * 2**20


@pytest.mark.parametrize(
    'data_slice, expected',
    [
        ({'start': 0, 'stop': 2}, ['row 0', 'row 1']),
        ({'start': -1, 'stop': 0}, ['row 2']),
        ({'start': 2, 'stop': -1, 'step': -2}, ['row 2', 'row 0']),
        ([2, 0], ['row 2', 'row 0']),
        (2, ['row 0', 'row 1']),
        (10**9, ['row 0', 'row 1', 'row 2']),
    ],
)
def test_a_valid_data_slice_still_selects_its_rows(layout, native, data_slice, expected):
    r = _dataset(native, 'allowed/data.jsonl', data_slice)
    assert r.status_code == 200, r.text
    assert [row['messages'][0]['content'] for row in r.json()['rows']] == expected


# ---- 3. bare names in native calls and dataset steps are checked like paths ------------------------------------------
@pytest.fixture()
def native_model(native) -> str:
    r = native.post('/models', json={'base_model': MODEL, 'config': {'r': 2}})
    assert r.status_code == 200, r.text
    return r.json()['model_id']


def _set_template(native: httpx.Client, model_id: str, source: str) -> httpx.Response:
    return native.post(
        f'/models/{model_id}/call/set_template',
        json={'args': ['Template'], 'kwargs': {'model_id_or_tokenizer': source}},
    )


def test_native_set_template_checks_bare_relative_names(layout, native, native_model, tiny_model_dir):
    shutil.copytree(tiny_model_dir, layout / 'secretdir' / 'tok')
    shutil.copytree(tiny_model_dir, layout / 'tokdir')  # a bare name, relative to the working directory
    shutil.copytree(tiny_model_dir, layout / 'allowed' / 'tok')
    for name in ('tokdir', 'secretdir/tok', '../cwd/tokdir', 'allowed/../tokdir', 'allowed/tok\x00'):
        assert_refused(_set_template(native, native_model, name), 403, 'inside the hosted model')
    for name in ('allowed/tok', str(tiny_model_dir)):  # an allowed root, the hosted model's own directory
        r = _set_template(native, native_model, name)
        assert r.status_code == 200, r.text
    # a hub id that is not a local path is no path: it goes to the tokenizer loader (offline here: not cached)
    assert_refused(_set_template(native, native_model, 'no-such-org/no-such-model'), 422, 'Could not load')


def test_dataset_steps_check_bare_relative_names(layout, native):
    for model_id in ('secretdir', '../x'):
        assert_refused(
            _dataset(native, 'allowed/data.jsonl', steps=[['set_template', 'Template', {'model_id': model_id}]]),
            404,
            'is not a base model served here',
        )
    for value in ('secretdir', '../x', 'secretdir/sub'):
        assert_refused(
            _dataset(
                native, 'allowed/data.jsonl', steps=[['map', 'MessagesProcessor', {'init_args': {'path': value}}]]
            ),
            403,
            'not from another path on the server',
        )
    for model_id in (MODEL, f'ms://{MODEL}', None):  # a hosted model, by name or hub id, keeps working
        r = _dataset(
            native, 'allowed/data.jsonl', steps=[['set_template', 'Template', {'model_id': model_id}], ['encode', {}]]
        )
        assert r.status_code == 200, r.text
        assert len(r.json()['rows']) == 3 and r.json()['rows'][0]['input_ids']
