"""torch.distributed helpers shared by every SPMD runtime (torchrun, and the workers of the Ray runtime).

One process = one rank. `init_process_group(mesh)` brings up the default process group from torchrun's
environment variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``): backend
``gloo`` on CPU and ``nccl`` on CUDA. Every other helper degrades to the single-process answer when no process
group exists, so library code calls them unconditionally.

Metrics reduce across the data-parallel ranks with `all_reduce_mean` / `weighted_mean`; losses that must equal the
single-process loss of the same global batch scale their backward with `data_parallel_loss_scale`.
torch is imported inside the functions: importing this module stays torch-free.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Mapping

from twinkle_core.errors import MeshError

TORCHRUN_ENV = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when not launched by torchrun or a runtime worker)."""
    return int(os.environ.get('WORLD_SIZE', '1'))


def env_rank() -> int:
    return int(os.environ.get('RANK', '0'))


def env_local_rank() -> int:
    return int(os.environ.get('LOCAL_RANK', os.environ.get('RANK', '0')))


def default_backend(device_type: str) -> str:
    """``nccl`` for CUDA, ``gloo`` for everything else."""
    return 'nccl' if device_type == 'cuda' else 'gloo'


def is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def init_process_group(
    mesh: Any = None, *, backend: str | None = None, timeout: timedelta = timedelta(minutes=10)
) -> bool:
    """Initialise the default process group if this is a multi-process run; return True if one exists after.

    A run is multi-process when ``WORLD_SIZE`` > 1 or `mesh` spans more than one rank. The mesh must match the
    launched world size (a mismatch raises `MeshError` naming both numbers). Idempotent: an existing process
    group is checked against the mesh and kept.
    """
    import torch
    import torch.distributed as dist

    mesh_world = mesh.world_size if mesh is not None else None
    if is_initialized():
        _check_world(mesh_world, dist.get_world_size())
        return True
    world = env_world_size()
    if mesh_world is not None and mesh_world > 1 and world == 1:
        raise MeshError(
            f'the device mesh spans {mesh_world} ranks but this process was not launched as one of '
            f'{mesh_world}: start the script with `torchrun --nproc_per_node {mesh_world} script.py` '
            f'(which sets {", ".join(TORCHRUN_ENV)}), or use the ray runtime.'
        )
    if world == 1:
        return False
    _check_world(mesh_world, world)
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise MeshError(f'WORLD_SIZE={world} but {missing} are not set; launch with torchrun or set them.')
    device_type = getattr(mesh, 'device_type', None) or ('cuda' if torch.cuda.is_available() else 'cpu')
    backend = backend or default_backend(device_type)
    if device_type == 'cuda':
        torch.cuda.set_device(env_local_rank())
    dist.init_process_group(backend=backend, init_method='env://', rank=env_rank(), world_size=world, timeout=timeout)
    return True


# Work handles of the barriers `destroy_process_group(synchronize=True)` ran: kept until the process exits, on purpose.
_teardown_barriers: list[Any] = []


def destroy_process_group(*, synchronize: bool = True) -> None:
    """Tear down every process group of this process (the default group, device-mesh sub-groups, any other).

    `synchronize=True` is the normal end of an SPMD run and is collective (every rank calls it, after its last
    collective): the default group and the device-mesh groups (FSDP2/HSDP/TP dimensions) first run a barrier, so no
    rank tears down while a peer is still inside a collective, and each barrier's work handle is kept until the
    process exits. `synchronize=False` (error paths, exit hooks: peers may be stuck elsewhere) only destroys.

    Why the handle is kept: torch cannot free a group that something still references, and FSDP2/DTensor device
    meshes stay referenced from torch's own caches after the model is gone. So a gloo group's worker threads keep
    running after ``destroy_process_group`` until the interpreter exits. A gloo worker drops its reference to a
    collective it ran *after* the caller's ``wait()`` returned; if that is the last reference, the collective's
    Python-visible tensors are freed on that thread, which must take the GIL. A thread that asks for the GIL after
    interpreter finalization began is ended by Python (``pthread_exit``) inside a C++ ``noexcept`` destructor: the
    process dies of SIGABRT, "terminate called without an active exception" (seen under load, when the worker is
    not scheduled before the main thread reaches finalization). A gloo barrier holds every collective that was
    queued or in flight when it was issued; while this module holds the barrier, no worker thread can drop the
    last reference to any of them, and they are freed at exit by the main thread.
    """
    if not is_initialized():
        return
    import torch.distributed as dist

    if synchronize:
        for group in _synchronized_groups():
            work = dist.barrier(group=group, async_op=True)
            work.wait()
            _teardown_barriers.append(work)
    dist.destroy_process_group()


def _synchronized_groups() -> list[Any]:
    """The default group and the device-mesh dimension groups of this rank, in the same order on every rank.

    Other groups (e.g. a weight-sync group shared with sampler processes) belong to whoever created them: a barrier
    there could wait for processes that never join it, so they are destroyed without one.
    """
    import torch.distributed as dist

    names = getattr(getattr(dist.distributed_c10d, '_world', None), 'pg_names', None) or {}
    world = dist.group.WORLD
    mesh_groups = [pg for pg in names if pg is not world and str(getattr(pg, 'group_desc', '')).startswith('mesh_')]
    return [world, *sorted(mesh_groups, key=lambda pg: names[pg])]


def _check_world(mesh_world: int | None, world: int) -> None:
    if mesh_world is not None and mesh_world != world:
        raise MeshError(
            f'the device mesh has world_size={mesh_world} but the process group has {world} ranks; '
            f'build the mesh with DeviceMesh.from_sizes(..., world_size={world}).'
        )


def get_rank() -> int:
    if is_initialized():
        import torch.distributed as dist

        return dist.get_rank()
    return 0


def get_world_size() -> int:
    if is_initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    return 1


def is_main_process() -> bool:
    """True on global rank 0 (and in a single process): the rank that writes files and logs."""
    return get_rank() == 0


def barrier() -> None:
    if is_initialized():
        import torch.distributed as dist

        dist.barrier()


def _reduce_device() -> Any:
    import torch
    import torch.distributed as dist

    return torch.device('cuda', torch.cuda.current_device()) if dist.get_backend() == 'nccl' else torch.device('cpu')


def all_reduce_sum(values: list[float], group: Any = None) -> list[float]:
    """Element-wise sum of `values` over the ranks of `group` (default: all ranks), in float64."""
    if not is_initialized() or not values:
        return list(values)
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_reduce_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.tolist()


def weighted_mean(value: float, weight: float, group: Any = None) -> float:
    """Global mean of per-rank means: sum(value_r * weight_r) / sum(weight_r) (e.g. a token-mean loss)."""
    total, count = all_reduce_sum([value * weight, weight], group)
    return total / count if count else 0.0


def all_reduce_mean(metrics: Mapping[str, Any], group: Any = None) -> dict[str, Any]:
    """Average the numeric entries of `metrics` over ranks; other entries pass through from this rank.

    Every rank must call it with the same numeric keys (in any order).
    """
    keys = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    if not is_initialized() or not keys:
        return dict(metrics)
    import torch.distributed as dist

    world = dist.get_world_size(group)
    sums = all_reduce_sum([float(metrics[k]) for k in keys], group)
    return {**metrics, **{k: s / world for k, s in zip(keys, sums)}}


def data_parallel_loss_scale(local_count: float, group: Any = None) -> float:
    """Factor for a rank-local mean loss so that gradient *averaging* across ranks yields the global mean.

    With `n_r` loss units (tokens for ``token_mean``, rows for ``sequence_mean``) on rank r and N = sum n_r, the
    single-process loss is sum_r n_r * mean_r / N. DDP/FSDP average gradients over the W data ranks, so each
    rank backpropagates ``mean_r * W * n_r / N``. Returns 1.0 without a process group. For ``sum`` losses the
    factor is simply W (use `get_world_size`).
    """
    if not is_initialized():
        return 1.0
    import torch.distributed as dist

    (total,) = all_reduce_sum([float(local_count)], group)
    return dist.get_world_size(group) * float(local_count) / total if total else 0.0
