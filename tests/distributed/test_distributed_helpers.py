"""Single-process behaviour and error messages of the SPMD helpers (no process group is started here)."""

from __future__ import annotations

import pytest

import twinkle_core
from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.runtime import distributed


def test_helpers_give_single_process_answers_without_a_process_group(monkeypatch) -> None:
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    assert not distributed.init_process_group(None)
    assert (distributed.get_rank(), distributed.get_world_size(), distributed.is_main_process()) == (0, 1, True)
    assert distributed.all_reduce_mean({'loss': 2.0, 'name': 'x'}) == {'loss': 2.0, 'name': 'x'}
    assert distributed.weighted_mean(3.0, 5) == 3.0
    assert distributed.data_parallel_loss_scale(7) == 1.0


def test_a_multi_rank_mesh_outside_torchrun_says_how_to_launch(monkeypatch) -> None:
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    with pytest.raises(MeshError, match='torchrun --nproc_per_node 2'):
        twinkle_core.initialize(mode='local', global_device_mesh=DeviceMesh.from_sizes(dp_size=2))
    twinkle_core.shutdown()


def test_world_size_and_mesh_must_agree(monkeypatch) -> None:
    monkeypatch.setenv('WORLD_SIZE', '4')
    with pytest.raises(MeshError, match='world_size=2 but the process group has 4 ranks'):
        distributed.init_process_group(DeviceMesh.from_sizes(dp_size=2))


def test_local_runtime_rejects_device_groups() -> None:
    with pytest.raises(TypeError, match="initialize\\(mode='ray', groups=...\\)"):
        twinkle_core.initialize(mode='local', groups=[DeviceGroup(name='model', ranks=2)])
    twinkle_core.shutdown()


def test_apply_device_mesh_checks_before_touching_the_model(monkeypatch) -> None:
    torch = pytest.importorskip('torch')
    from twinkle_transformers.parallel import apply_device_mesh

    model = torch.nn.Linear(2, 2)
    assert apply_device_mesh(model, None) is model
    assert apply_device_mesh(model, DeviceMesh.from_sizes(dp_size=1)) is model
    with pytest.raises(MeshError, match='needs a torch.distributed process group'):
        apply_device_mesh(model, DeviceMesh.from_sizes(dp_size=2))
