"""DataLoader: batching, min_batch_size/drop_last, seeded shuffling, exact resume, data-parallel sharding."""

from __future__ import annotations

import itertools

import pytest

from twinkle_core.dataset import DataLoader, Dataset, DatasetMeta
from twinkle_core.errors import InvalidInputError
from twinkle_core.mesh import DeviceMesh

ROWS = [{'input_ids': [i, i + 1], 'labels': [-100, i + 1], 'row': i} for i in range(23)]


def ids(batches):
    return [[r['row'] for r in b] for b in batches]


@pytest.mark.parametrize(
    'kwargs, sizes',
    [
        ({}, [5, 5, 5, 5, 3]),
        ({'drop_last': True}, [5, 5, 5, 5]),
        ({'min_batch_size': 4}, [5, 5, 5, 5]),
        ({'min_batch_size': 3}, [5, 5, 5, 5, 3]),
    ],
)
def test_batch_sizes_and_len(kwargs, sizes):
    loader = DataLoader(ROWS, batch_size=5, **kwargs)
    batches = list(loader)
    assert [len(b) for b in batches] == sizes and len(loader) == len(sizes)
    assert ids(batches)[0] == [0, 1, 2, 3, 4]


def test_shuffle_is_seeded_per_epoch():
    loader = DataLoader(ROWS, batch_size=4, shuffle=True, seed=3)
    epoch0, epoch1 = ids(loader), ids(loader)  # a full loop moves on to the next epoch
    assert loader.epoch == 2
    assert sorted(itertools.chain(*epoch0)) == list(range(23)) and epoch0 != epoch1
    assert epoch0 != [list(range(i, min(i + 4, 23))) for i in range(0, 23, 4)]
    again = DataLoader(ROWS, batch_size=4, shuffle=True, seed=3)
    assert ids(again) == epoch0
    again.set_epoch(1)
    assert ids(again) == epoch1
    assert ids(DataLoader(ROWS, batch_size=4, shuffle=True, seed=4)) != epoch0


@pytest.mark.parametrize('stop_after', [0, 2, 6])
def test_resume_yields_exactly_the_remaining_batches(stop_after):
    reference = DataLoader(ROWS, batch_size=4, shuffle=True, seed=7)
    reference.set_epoch(1)
    expected = ids(reference)
    loader = DataLoader(ROWS, batch_size=4, shuffle=True, seed=7)
    loader.set_epoch(1)
    seen = ids(itertools.islice(loader, stop_after))
    state = loader.state_dict()
    resumed = DataLoader(ROWS, batch_size=4, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    assert seen + ids(resumed) == expected
    assert resumed.epoch == 2  # the resumed epoch finished; the next loop starts epoch 2


def test_breaking_out_keeps_the_position():
    loader = DataLoader(ROWS, batch_size=10)
    first = next(iter(loader))
    rest = ids(loader)
    assert [r['row'] for r in first] + list(itertools.chain(*rest)) == list(range(23))
    exhausted = DataLoader(ROWS, batch_size=10)
    for _ in zip(range(3), exhausted):  # took every batch, but the loop never saw the end of the epoch
        pass
    assert ids(exhausted) == [] and exhausted.epoch == 1  # the rest of epoch 0 is empty
    assert ids(exhausted)[0] == list(range(10))


def test_resume_refuses_different_data():
    state = DataLoader(ROWS, batch_size=4).state_dict()
    with pytest.raises(InvalidInputError, match='num_rows: saved 23, now 22'):
        DataLoader(ROWS[:22], batch_size=4).load_state_dict(state)
    with pytest.raises(InvalidInputError, match='batch_size: saved 4, now 5'):
        DataLoader(ROWS, batch_size=5).load_state_dict(state)


@pytest.mark.parametrize('world', [2, 3, 4])
def test_rank_shards_make_up_the_global_batch(world):
    single = ids(DataLoader(ROWS, batch_size=8, shuffle=True, seed=1))
    shards = [ids(DataLoader(ROWS, batch_size=8, shuffle=True, seed=1).shard(r, world)) for r in range(world)]
    assert all(len(s) == len(single) for s in shards)
    for step, global_batch in enumerate(single):
        parts = [s[step] for s in shards]
        assert list(itertools.chain(*parts)) == global_batch  # contiguous, in rank order, nothing twice
        assert max(map(len, parts)) - min(map(len, parts)) <= 1 and min(map(len, parts)) >= 1


def test_device_mesh_sharding_follows_data_ranks(monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)  # ranks 0,1 -> data rank 0; ranks 2,3 -> data rank 1
    per_rank = {r: ids(DataLoader(ROWS, batch_size=6, device_mesh=mesh, rank=r)) for r in range(4)}
    assert per_rank[0] == per_rank[1] and per_rank[2] == per_rank[3] and per_rank[0] != per_rank[2]
    assert per_rank[0][0] + per_rank[2][0] == list(range(6))
    monkeypatch.setenv('RANK', '3')
    assert ids(DataLoader(ROWS, batch_size=6, device_mesh=mesh)) == per_rank[3]
    # the last global batch (23 % 6 = 5 rows) still gives every rank rows; fewer than 2 rows would be dropped
    assert DataLoader(ROWS[:13], batch_size=6, device_mesh=mesh, rank=0).min_batch_size == 2
    assert len(DataLoader(ROWS[:13], batch_size=6, device_mesh=mesh, rank=0)) == 2


def test_invalid_settings():
    with pytest.raises(InvalidInputError, match='batch_size must be a positive integer'):
        DataLoader(ROWS, batch_size=0)
    with pytest.raises(InvalidInputError, match='min_batch_size must be between 1 and batch_size=4'):
        DataLoader(ROWS, batch_size=4, min_batch_size=5)
    with pytest.raises(InvalidInputError, match='smaller than the number of data ranks 8'):
        DataLoader(ROWS, batch_size=4).shard(0, 8)
    with pytest.raises(InvalidInputError, match='min_batch_size=1 is smaller than the number of data ranks 2'):
        DataLoader(ROWS, batch_size=4, min_batch_size=1).shard(0, 2)


def test_rank_comes_from_torch_distributed_when_initialised(monkeypatch, tmp_path):
    dist = pytest.importorskip('torch.distributed')
    mesh = DeviceMesh.from_sizes(dp_size=2)
    monkeypatch.setenv('RANK', '1')  # torch.distributed wins over the environment
    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0, world_size=1)
    try:
        assert ids(DataLoader(ROWS, batch_size=4, device_mesh=mesh))[0] == [0, 1]
    finally:
        dist.destroy_process_group()
    assert ids(DataLoader(ROWS, batch_size=4, device_mesh=mesh))[0] == [2, 3]


def test_over_an_encoded_dataset(samples, tiny_model_dir):
    ds = Dataset(DatasetMeta(str(samples['self_cognition']), data_slice=range(10)))
    ds.map('SelfCognitionProcessor', init_args={'model_name': 'T', 'model_author': 'A'})
    ds.set_template('Template', model_id=str(tiny_model_dir), max_length=64).encode()
    loader = DataLoader(dataset=ds, batch_size=4, collate=lambda rows: {'n': len(rows), 'rows': rows})
    batches = list(loader)
    assert [b['n'] for b in batches] == [4, 4, 2] and len(loader) == 3
    assert batches[0]['rows'][1] == ds[1] and set(batches[0]['rows'][0]) == {'input_ids', 'labels'}
