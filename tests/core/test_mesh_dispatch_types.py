"""DeviceMesh / DeviceGroup, dispatch helpers and data-format validation (pure Python, no torch)."""

from __future__ import annotations

import pytest

from twinkle_core.dispatch import collect_results, remote_method, remote_methods, split_for_dp
from twinkle_core.errors import InvalidInputError, MeshError
from twinkle_core.mesh import DIMS, DeviceGroup, DeviceMesh
from twinkle_core.types import InputFeature, SamplingParams, Trajectory, as_input_features


def test_mesh_rank_coordinate_round_trip() -> None:
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, fsdp_size=1, cp_size=1, tp_size=3)
    assert mesh.world_size == 12 and mesh.data_world_size == 2
    for rank in range(mesh.world_size):
        coord = mesh.coordinate(rank)
        assert set(coord) == set(DIMS)
        assert mesh.rank_of(**coord) == rank
    assert mesh.coordinate(1) == {'pp': 0, 'dp': 0, 'fsdp': 0, 'cp': 0, 'tp': 1}  # tp innermost
    assert mesh.coordinate(3)['dp'] == 1 and mesh.coordinate(6)['pp'] == 1


def test_mesh_groups() -> None:
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    assert mesh.group_ranks('tp', 0) == [0, 1]
    assert mesh.group_ranks('dp', 1) == [1, 3]
    assert mesh.all_groups('tp') == [[0, 1], [2, 3]]
    assert mesh.all_groups(('dp', 'tp')) == [[0, 1, 2, 3]]
    assert [mesh.data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert [mesh.is_data_leader(r) for r in range(4)] == [True, False, True, False]
    assert DeviceMesh.from_sizes(world_size=8, tp_size=2).size('dp') == 4
    assert 'tp=2' in repr(mesh)


@pytest.mark.parametrize(
    'kwargs, fragment',
    [
        ({'tp_size': 0}, 'tp_size must be a positive integer'),
        ({'world_size': 6, 'tp_size': 4}, 'not divisible'),
        ({'world_size': 6, 'dp_size': 2, 'tp_size': 2}, 'world_size=6 but'),
        ({'dp_size': 3, 'ep_size': 2}, 'ep_size=2 must divide'),
    ],
)
def test_mesh_validation(kwargs, fragment) -> None:
    with pytest.raises(MeshError, match=fragment):
        DeviceMesh.from_sizes(**kwargs)


def test_mesh_bad_rank_and_coordinates() -> None:
    mesh = DeviceMesh.from_sizes(dp_size=2)
    with pytest.raises(MeshError, match='outside 0..1'):
        mesh.coordinate(2)
    with pytest.raises(MeshError, match='outside'):
        mesh.rank_of(dp=2)
    with pytest.raises(MeshError, match='unknown mesh dimension'):
        mesh.rank_of(xp=0)
    with pytest.raises(MeshError, match='unknown mesh dimension'):
        mesh.group_ranks('xp', 0)


def test_device_group() -> None:
    assert DeviceGroup('model', 3).ranks == [0, 1, 2]
    assert DeviceGroup('sampler', [4, 5]).world_size == 2
    for bad in ([], [1, 1], [-1]):
        with pytest.raises(MeshError, match='distinct non-negative'):
            DeviceGroup('x', bad)
    with pytest.raises(MeshError, match='needs a name'):
        DeviceGroup('', 1)


def test_split_for_dp() -> None:
    assert split_for_dp(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_for_dp([1], 2) == [[1], []]
    assert sum(split_for_dp(list(range(10)), 4), []) == list(range(10))
    with pytest.raises(ValueError):
        split_for_dp([1], 0)


def test_collect_results() -> None:
    assert collect_results([1, 2], 'first') == 1
    assert collect_results([1, 2], 'list') == [1, 2]
    assert collect_results([1, 2], 'none') is None
    assert collect_results([1.0, 3.0], 'mean') == 2.0
    assert collect_results([{'loss': 1.0, 'name': 'a'}, {'loss': 3.0, 'name': 'b'}], 'mean') == {
        'loss': 2.0,
        'name': 'a',
    }
    assert collect_results([[1], [2, 3]], 'concat') == [1, 2, 3]
    assert collect_results([{'x': [1]}, {'x': [2]}], 'concat') == {'x': [1, 2]}
    with pytest.raises(ValueError, match='unknown collect mode'):
        collect_results([1, 2], 'sum')  # type: ignore[arg-type]


def test_remote_methods_are_inherited() -> None:
    class Base:
        @remote_method(dispatch='slice_dp', collect='mean')
        def step(self): ...

    class Child(Base):
        def step(self): ...

    spec = remote_methods(Child)['step']
    assert (spec.dispatch, spec.collect, spec.mutates) == ('slice_dp', 'mean', True)


def test_types_validation_errors() -> None:
    with pytest.raises(InvalidInputError, match='Batch row 1 is not a valid InputFeature'):
        as_input_features([{'input_ids': [1, 2]}, {'input_ids': [1, 2], 'labels': [1]}])
    with pytest.raises(InvalidInputError, match='row 0 is a str'):
        as_input_features(['x'])
    with pytest.raises(InvalidInputError, match='non-empty list'):
        as_input_features([])
    rows = as_input_features([InputFeature(input_ids=[1, 2], labels=[-100, 2]), {'input_ids': [3], 'extra': 1}])
    assert rows == [{'input_ids': [1, 2], 'labels': [-100, 2]}, {'input_ids': [3], 'extra': 1}]
    with pytest.raises(ValueError, match='at least one message'):
        Trajectory(messages=[])
    with pytest.raises(ValueError):
        Trajectory(messages=[{'role': 'robot', 'content': 'x'}])
    with pytest.raises(ValueError, match='top_k'):
        SamplingParams(top_k=0)
    assert SamplingParams(stop='</s>').stop_strings() == ['</s>']
    assert SamplingParams(stop=[7, 8]).stop_token_ids() == [7, 8]
    assert SamplingParams(stop=['a', 'b']).stop_token_ids() == []


def test_device_type_defaults_to_the_machine_and_gpu_means_cuda():
    import torch

    machine = 'cuda' if torch.cuda.is_available() else 'cpu'
    assert DeviceMesh.from_sizes(dp_size=2).device_type == machine
    assert DeviceGroup('model', 2).device_type == machine
    assert DeviceGroup('sampler', [2], device_type='GPU').device_type == 'cuda'  # the Twinkle documents' spelling
    assert DeviceMesh.from_sizes(device_type='CPU').device_type == 'cpu'
    with pytest.raises(MeshError, match='device_type must be'):
        DeviceGroup('model', 1, device_type='')
