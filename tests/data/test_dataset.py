"""Dataset: local files of every kind, slicing, map/filter/encode, mixing, caching, hub id resolution."""

from __future__ import annotations

import json

import pytest

from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.errors import ComponentNotFoundError, InvalidInputError
from twinkle_core.preprocessor import LengthFilter
from twinkle_core.template.chat_template import ChatTemplate
from twinkle_core.template.labels import IGNORE_INDEX
from twinkle_core.types import as_input_features

SELF_COGNITION = {'model_name': 'Twinkle', 'model_author': 'ModelScope'}


def _alpaca_rows(samples):
    return [json.loads(line) for line in samples['alpaca'].read_text().splitlines()]


@pytest.fixture
def alpaca_files(samples, tmp_path):
    """The alpaca sample as jsonl, csv, parquet, a save_to_disk directory and a folder of data files."""
    import datasets

    data = datasets.Dataset.from_list(_alpaca_rows(samples))
    paths = {
        'jsonl': samples['alpaca'],
        'csv': tmp_path / 'alpaca.csv',
        'parquet': tmp_path / 'alpaca.parquet',
        'disk': tmp_path / 'alpaca_disk',
        'folder': tmp_path / 'alpaca_folder',
    }
    paths['folder'].mkdir()
    data.to_json(str(paths['folder'] / 'train.jsonl'))
    data.to_csv(str(paths['csv']))
    data.to_parquet(str(paths['parquet']))
    data.save_to_disk(str(paths['disk']))
    return paths


@pytest.mark.parametrize('kind', ['jsonl', 'csv', 'parquet', 'disk', 'folder'])
def test_local_formats_map_filter_encode(kind, alpaca_files, samples, tiny_model_dir, tmp_path):
    rows = _alpaca_rows(samples)
    ds = Dataset(DatasetMeta(str(alpaca_files[kind]), data_slice=10), cache_dir=str(tmp_path / 'cache'))
    assert len(ds) == 10
    ds.map('AlpacaProcessor')
    assert ds[3]['messages'][-1]['content'] == rows[3]['output']
    ds.set_template('Template', model_id=str(tiny_model_dir), max_length=256).encode()
    assert sorted(ds.column_names) == ['input_ids', 'labels']
    assert len(as_input_features(list(ds))) == 10  # every row is a valid InputFeature
    template = ChatTemplate(str(tiny_model_dir))
    for i in range(10):
        labelled = [t for t in ds[i]['labels'] if t != IGNORE_INDEX]
        assert template.decode(labelled, skip_special_tokens=False) == rows[i]['output'] + '<|im_end|>'
    lengths = [len(r['input_ids']) for r in ds]
    limit = sorted(lengths)[4]
    ds.filter(LengthFilter(max_length=limit))
    assert len(ds) == sum(n <= limit for n in lengths) and all(len(r['input_ids']) <= limit for r in ds)


@pytest.mark.parametrize(
    'data_slice, expected',
    [
        (5, [0, 1, 2, 3, 4]),
        (range(2, 5), [2, 3, 4]),
        (slice(-3, None), [27, 28, 29]),
        ([7, 1, 7], [7, 1, 7]),
        (1000, list(range(30))),
    ],
)
def test_data_slice(data_slice, expected, samples):
    rows = _alpaca_rows(samples)
    ds = Dataset(DatasetMeta(str(samples['alpaca']), data_slice=data_slice))
    assert [r['instruction'] for r in ds] == [rows[i]['instruction'] for i in expected]


def test_bad_inputs_are_explained(samples, tiny_model_dir, tmp_path):
    with pytest.raises(InvalidInputError, match='selects row.*30 rows'):
        Dataset(DatasetMeta(str(samples['alpaca']), data_slice=[0, 30]))
    with pytest.raises(InvalidInputError, match='not a local file.*ms://org/name'):
        Dataset(str(tmp_path / 'missing.jsonl'))
    (tmp_path / 'data.xml').write_text('<x/>')
    with pytest.raises(InvalidInputError, match="unknown file type '.xml'"):
        Dataset(str(tmp_path / 'data.xml'))
    with pytest.raises(ComponentNotFoundError, match="No dataset_source named 's3'"):
        Dataset('s3://bucket/data')
    ds = Dataset(str(samples['alpaca']))
    with pytest.raises(InvalidInputError, match='set_template'):
        ds.encode()
    with pytest.raises(InvalidInputError, match='no "messages" column'):
        ds.set_template('Template', model_id=str(tiny_model_dir)).encode()


def test_row_missing_a_field_is_named_with_its_index(samples, tmp_path):
    rows = _alpaca_rows(samples)[:6]
    del rows[4]['output']
    path = tmp_path / 'broken.jsonl'
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    with pytest.raises(
        InvalidInputError,
        match=r'broken.jsonl, row 4: AlpacaProcessor: row is missing field\(s\) '
        r"'output'",
    ):
        Dataset(str(path)).map('AlpacaProcessor')


def test_encode_error_names_the_row(samples, tiny_model_dir):
    ds = Dataset(DatasetMeta(str(samples['alpaca']), data_slice=8)).map('AlpacaProcessor')
    lengths = [len(ChatTemplate(str(tiny_model_dir)).encode(r)['input_ids']) for r in ds]
    limit = max(lengths) - 1
    longest = lengths.index(max(lengths))
    ds.set_template('Template', model_id=str(tiny_model_dir), max_length=limit, truncation_strategy='error')
    with pytest.raises(
        InvalidInputError, match=f'row {longest}: Encoded row has {max(lengths)} tokens, more than max_length={limit}'
    ):
        ds.encode()


def test_mixing_concat_with_per_dataset_preprocessors(samples):
    gsm8k, alpaca, sharegpt = (DatasetMeta(str(samples[k])) for k in ('gsm8k', 'alpaca', 'sharegpt'))
    ds = Dataset([gsm8k, alpaca, sharegpt])
    ds.map('GSM8KProcessor', dataset_meta=gsm8k).map('AlpacaProcessor', dataset_meta=alpaca)
    ds.map('ShareGPTProcessor', dataset_meta=str(samples['sharegpt']))
    n_gsm8k, n_alpaca = len(ds.part(gsm8k)), len(ds.part(alpaca))
    assert len(ds) == n_gsm8k + n_alpaca + len(ds.part(sharegpt))
    assert ds[0]['ground_truth'] is not None and ds[n_gsm8k]['ground_truth'] is None
    assert ds[n_gsm8k]['messages'][-1]['content'] == _alpaca_rows(samples)[0]['output']
    with pytest.raises(InvalidInputError, match='is not one of this Dataset'):
        ds.map('AlpacaProcessor', dataset_meta='other.jsonl')


def test_mixing_aligns_message_fields(tiny_model_dir):
    plain = Dataset.from_hf([{'messages': [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a'}]}])
    with_loss = [
        {
            'messages': [
                {'role': 'user', 'content': 'q'},
                {'role': 'assistant', 'content': 'skip', 'loss': False},
                {'role': 'user', 'content': 'q2'},
                {'role': 'assistant', 'content': 'a2'},
            ]
        }
    ]
    from twinkle_core.dataset.mixing import Mixing

    mixed = Mixing().combine([plain.data, Dataset.from_hf(with_loss).data])
    assert mixed[0]['messages'][1] == {'role': 'assistant', 'content': 'a', 'loss': None}
    assert mixed[1]['messages'][1]['loss'] is False
    ds = Dataset.from_hf(mixed).set_template('Template', model_id=str(tiny_model_dir)).encode()
    template = ChatTemplate(str(tiny_model_dir))
    assert [template.decode_completion(r) for r in ds] == ['a', 'a2']


def test_extra_fields_survive_encoding_when_the_first_row_lacks_them(tiny_model_dir):
    rows = [
        {'messages': [{'role': 'user', 'content': 'q'}], 'ground_truth': None},
        {'messages': [{'role': 'user', 'content': 'q'}], 'ground_truth': '7'},
    ]
    ds = Dataset.from_hf(rows).set_template('Template', model_id=str(tiny_model_dir))
    ds.encode(add_generation_prompt=True)
    assert [r['ground_truth'] for r in ds] == [None, '7']


def test_mixing_interleave_is_seeded_and_weighted(samples):
    def build(seed, probabilities):
        a = DatasetMeta(str(samples['alpaca']))
        g = DatasetMeta(str(samples['gsm8k']))
        ds = Dataset(
            [a, g], mixing='interleave', probabilities=probabilities, seed=seed, stopping_strategy='all_exhausted'
        )
        ds.map('AlpacaProcessor', dataset_meta=a).map('GSM8KProcessor', dataset_meta=g)
        return ['G' if r['ground_truth'] else 'A' for r in ds]

    first, again, other = build(0, [0.5, 0.5]), build(0, [0.5, 0.5]), build(1, [0.5, 0.5])
    assert first == again and first != other
    assert set(first) == {'A', 'G'}
    heavy = build(0, [0.9, 0.1])
    head = heavy[:30]
    assert head.count('A') > head.count('G')
    with pytest.raises(InvalidInputError, match='2 probabilities given for 1 data sets'):
        Dataset([str(samples['alpaca'])], mixing='interleave', probabilities=[0.5, 0.5])
    with pytest.raises(InvalidInputError, match='sum to 1'):
        Dataset([str(samples['alpaca']), str(samples['gsm8k'])], mixing='interleave', probabilities=[0.5, 0.6])


class CountingTemplate(ChatTemplate):
    """Counts encoded rows, to tell a cache hit from a recomputation."""

    encoded_rows = 0

    def encode_batch(self, trajectories, *, add_generation_prompt=False):
        type(self).encoded_rows += len(trajectories)
        return super().encode_batch(trajectories, add_generation_prompt=add_generation_prompt)


def test_encoded_results_are_reused_on_a_second_run(samples, tiny_model_dir, tmp_path):
    def run():
        ds = Dataset(
            DatasetMeta(str(samples['self_cognition']), data_slice=range(40)), cache_dir=str(tmp_path / 'cache')
        )
        ds.map('SelfCognitionProcessor', init_args=SELF_COGNITION)
        ds.set_template(CountingTemplate(str(tiny_model_dir), max_length=128)).encode()
        return ds

    CountingTemplate.encoded_rows = 0
    first = run()
    assert CountingTemplate.encoded_rows == 40
    second = run()
    assert CountingTemplate.encoded_rows == 40  # nothing re-encoded: read from the cache
    assert second.data.cache_files == first.data.cache_files
    assert second.data[:] == first.data[:]
    ds = Dataset(DatasetMeta(str(samples['self_cognition']), data_slice=range(40)), cache_dir=str(tmp_path / 'cache'))
    ds.map('SelfCognitionProcessor', init_args=SELF_COGNITION)
    ds.set_template(CountingTemplate(str(tiny_model_dir), max_length=64)).encode()  # other options: new cache
    assert CountingTemplate.encoded_rows == 80


def test_prompt_encoding_for_rl(samples, tiny_model_dir):
    ds = Dataset(DatasetMeta(str(samples['gsm8k']), data_slice=4)).map('GSM8KProcessor')
    ds.set_template('Template', model_id=str(tiny_model_dir)).encode(add_generation_prompt=True)
    assert sorted(ds.column_names) == ['ground_truth', 'input_ids', 'messages']
    template = ChatTemplate(str(tiny_model_dir))
    assert template.decode(ds[0]['input_ids'], skip_special_tokens=False).endswith('<|im_start|>assistant\n')
    # the prompt's messages (the answer turn dropped): a sampled completion is appended to them for the rewards
    assert [m['role'] for m in ds[0]['messages']] == [m['role'] for m in ds[0]['messages'] if m['role'] != 'assistant']
    assert ds[0]['messages'][-1]['role'] == 'user'


def test_from_hf_rows_and_callable_preprocessor(tiny_model_dir):
    rows = [{'q': f'question {i}', 'a': f'answer {i}'} for i in range(5)]
    ds = Dataset.from_hf(rows, name='qa')
    ds.map(
        lambda row: {'messages': [{'role': 'user', 'content': row['q']}, {'role': 'assistant', 'content': row['a']}]}
    )
    ds.filter(lambda row: row['messages'][0]['content'] != 'question 2')
    assert len(ds) == 4 and [r['messages'][1]['content'] for r in ds.rows([3, 0])] == ['answer 4', 'answer 0']
    with pytest.raises(IndexError):
        ds[4]


def test_hf_id_loads_from_the_datasets_cache_offline(samples, tmp_path):
    """hf://org/name end to end, offline: `datasets` answers from its cache of that repo (laid out here)."""
    import shutil

    import datasets

    if not datasets.config.HF_HUB_OFFLINE:
        pytest.skip('needs HF_HUB_OFFLINE=1 (set by tests/conftest.py) so that nothing is fetched')
    cache = tmp_path / 'hf-cache'
    datasets.load_dataset('json', data_files=str(samples['gsm8k']), split='train', cache_dir=str(cache))
    built = next((cache / 'json').glob('*/*/*'))
    repo_cache = cache / 'acme___gsm8k_mini' / 'default' / '0.0.0' / built.name
    repo_cache.mkdir(parents=True)
    for f in built.iterdir():
        shutil.copy(f, repo_cache / f.name.replace('json-', 'gsm8k_mini-'))
    ds = Dataset(DatasetMeta('hf://acme/gsm8k_mini', data_slice=5), cache_dir=str(cache)).map('GSM8KProcessor')
    expected = [json.loads(line)['question'] for line in samples['gsm8k'].read_text().splitlines()[:5]]
    assert [r['messages'][1]['content'] for r in ds] == expected


def test_hf_ids_resolve_to_load_dataset(monkeypatch):
    import datasets

    from twinkle_core.dataset.sources import load_meta

    calls = []

    def fake_load_dataset(path, name=None, *, split=None, revision=None, cache_dir=None, **kw):
        calls.append((path, name, split, revision))
        return datasets.Dataset.from_list([{'x': i} for i in range(10)])

    monkeypatch.setattr(datasets, 'load_dataset', fake_load_dataset)
    got = load_meta(DatasetMeta('hf://openai/gsm8k@v2', subset_name='main', split='test', data_slice=3))
    assert len(got) == 3 and calls == [('openai/gsm8k', 'main', 'test', 'v2')]
    with pytest.raises(InvalidInputError, match='expected "hf://org/name'):
        load_meta(DatasetMeta('hf://just-a-name'))


def test_ms_ids_resolve_to_msdataset(monkeypatch):
    import datasets

    msdatasets = pytest.importorskip('modelscope.msdatasets')

    from twinkle_core.dataset.sources import load_meta

    calls = []

    class Loaded:
        def to_hf_dataset(self):
            return datasets.Dataset.from_list([{'x': i} for i in range(10)])

    def fake_load(repo, *, subset_name=None, split=None, version=None, cache_dir=None, **kw):
        calls.append((repo, subset_name, split, version))
        return Loaded()

    monkeypatch.setattr(msdatasets.MsDataset, 'load', staticmethod(fake_load))
    got = load_meta(DatasetMeta('ms://modelscope/gsm8k@v1.0', subset_name='main', data_slice=range(2, 6)))
    assert got['x'] == [2, 3, 4, 5] and calls == [('modelscope/gsm8k', 'main', 'train', 'v1.0')]
