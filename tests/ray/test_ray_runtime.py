"""The Ray runtime with a small real torch component (real gloo DDP inside a 2-actor group)."""

from __future__ import annotations

import os

import pytest

import twinkle_core
from twinkle_core.errors import InvalidInputError, MeshError
from twinkle_core.mesh import DeviceGroup

pytest.importorskip('ray')
from toy_components import LinearRegressor, RowSource, make_batches  # noqa: E402

from twinkle_ray import GroupBrokenError, RemoteCallError  # noqa: E402
from twinkle_ray.proxy import LazyResult  # noqa: E402


def train_locally(batches):
    """The same training in this process (no remote_group: built here even while the ray runtime is active)."""
    model = LinearRegressor()
    losses = []
    for batch in batches:
        losses.append(model.forward_backward(inputs=batch)['loss'])
        model.clip_grad_and_step()
    return losses, model.weights()


@pytest.fixture(scope='module')
def ray_groups(ray_cluster):
    runtime = twinkle_core.initialize(
        mode='ray', groups=[DeviceGroup(name='model', ranks=2), DeviceGroup(name='other', ranks=2)]
    )
    yield runtime
    twinkle_core.shutdown()


def test_two_actor_group_trains_like_one_process(ray_groups) -> None:
    batches = make_batches(num_batches=4, batch_size=6)
    local_losses, local_weights = train_locally(batches)
    model = LinearRegressor(remote_group='model')
    assert model.world() == [(0, 2), (1, 2)]  # one process group across the two actors
    losses = []
    for batch in batches:
        out = model.forward_backward(inputs=batch)
        assert out['rank_of_row'] == [0, 0, 0, 1, 1, 1]  # contiguous slices, concatenated back in rank order
        losses.append(out['loss'])
        model.clip_grad_and_step()
    assert losses == pytest.approx(local_losses, abs=1e-6)
    assert losses[-1] < losses[0]
    rank0, rank1 = model.weights()  # DDP keeps the replicas identical
    assert rank0 == pytest.approx(rank1, abs=1e-7)
    assert rank0 == pytest.approx(local_weights, abs=1e-6)


def test_batches_produced_in_the_group_stay_there(ray_groups) -> None:
    batches = make_batches(num_batches=3, batch_size=4, seed=7)
    fed = LinearRegressor(remote_group='model', seed=3)
    expected = [fed.forward_backward(inputs=b)['loss'] for b in batches]
    model = LinearRegressor(remote_group='model', seed=3, lazy_collect=True)
    source = RowSource(batches, remote_group='model', lazy_collect=True)
    losses = []
    for batch in source:
        assert isinstance(batch, LazyResult)  # per-rank refs; handed rank to rank to the model below
        out = model.forward_backward(inputs=batch)
        assert isinstance(out, LazyResult)
        losses.append(out['loss'])  # transparent use fetches it
    assert losses == pytest.approx(expected, abs=1e-6)
    assert len(batch) == 4 and batch[0] == batches[-1][0]  # fetching a batch concatenates the ranks' parts
    eager = list(RowSource(batches, remote_group='model'))  # lazy_collect=False: values, as the documents loop
    assert [type(b) for b in eager] == [list] * 3 and eager[0] == batches[0]


def test_bad_calls_fail_fast_with_clear_errors(ray_groups) -> None:
    model = LinearRegressor(remote_group='model')
    with pytest.raises(InvalidInputError, match='must be a list of rows'):
        model.forward_backward(inputs={'x': [1.0]})
    with pytest.raises(InvalidInputError, match='1 rows cannot be split across 2 data ranks'):
        model.forward_backward(inputs=make_batches(1, 1)[0])
    with pytest.raises(AttributeError, match='reset is not declared with @remote_method'):
        model.reset()  # a real method, but not part of the remote interface
    with pytest.raises(AttributeError, match='net is not a method of the class'):
        model.net  # noqa: B018 - an instance attribute lives in the actors only
    with pytest.raises(MeshError, match="unknown device group 'nope'"):
        LinearRegressor(remote_group='nope')


def test_failure_in_one_actor_names_it_and_cleanup_is_complete(ray_groups, ray_cluster) -> None:
    from ray.exceptions import RayActorError
    from ray.util import placement_group_table

    group = ray_groups.group('other')
    model = LinearRegressor(remote_group='other')
    with pytest.raises(
        RemoteCallError,
        match=r"fail_on_rank failed in actor \(group='other', rank=1\).*"
        r'deliberate failure on rank 1',
    ) as info:
        model.fail_on_rank(1)  # rank 0 is left waiting in a barrier
    assert (info.value.group, info.value.rank) == ('other', 1)
    assert 'deliberate failure' in info.value.remote_traceback
    with pytest.raises(GroupBrokenError, match="device group 'other' is unusable"):
        model.weights()
    workers, pg_id = list(group.workers), group.placement_group.id.hex()
    twinkle_core.shutdown()
    for worker in workers:  # killed, even the one stuck in the barrier
        with pytest.raises(RayActorError):
            ray_cluster.get(worker.ping.remote(), timeout=30)
    assert placement_group_table()[pg_id]['state'] == 'REMOVED'


@pytest.mark.slow
def test_a_program_starts_its_own_ray_next_to_a_cluster_started_on_the_machine(tmp_path) -> None:
    """A cluster runs on this machine as `ray start` leaves one (its address in /tmp/ray/ray_current_cluster);
    ``initialize(mode='ray')`` without an address starts an instance of its own (Ray's default would join that
    cluster, and then refuse the ``num_cpus`` the runtime asks for); ``address='auto'`` or ``RAY_ADDRESS`` join it."""
    import subprocess
    import sys

    from ray.cluster_utils import Cluster

    script = tmp_path / 'program.py'
    script.write_text(
        'import ray, twinkle_core\n'
        'from twinkle_core.mesh import DeviceGroup\n'
        "twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='g', ranks=1)])\n"
        "print('gcs', ray.get_runtime_context().gcs_address)\n"
        'twinkle_core.shutdown()\n'
    )
    env = {k: v for k, v in os.environ.items() if k != 'RAY_ADDRESS'}
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={'num_cpus': 1, 'include_dashboard': False})
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    finally:
        cluster.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    ours = done.stdout.split('gcs ')[-1].strip()
    assert ours and ours != cluster.address
