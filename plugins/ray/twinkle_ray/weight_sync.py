"""Weight sync from a model group to a sampler group (separate Ray actors) through the CheckpointEngine.

    sync = WeightSync(model, sampler)     # proxies of a model and a sampler in two device groups
    sync.sync_weights()                   # model (export rank) -> every sampler rank, torch.distributed broadcast

Each group already has its own default process group (the one its DDP/FSDP/TP runs on), so the bytes move on a
second, side process group over {model rank 0} + {every sampler rank}: gloo on CPU, NCCL on GPUs. Every model rank
runs the sync: a sharded model (FSDP/TP) gathers each weight collectively while exporting, and rank 0 -- the
export rank -- streams the buckets. What moves (LoRA only after the first sync, base + LoRA the first time, merged
weights on request) is decided by `twinkle_core.weight_sync.CheckpointEngineManager`; the bytes move with its
`BroadcastCheckpointEngine`. Each sampler rank receives in its actor and imports through the Sampler interface
(vLLM's engine process gets them through its own RPC).
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from twinkle_core.errors import TwinkleError
from twinkle_core.weight_sync.in_process import InProcessCheckpointEngine
from twinkle_ray.group import wait_across
from twinkle_ray.proxy import ComponentProxy

SYNC_TIMEOUT = timedelta(minutes=10)
_names = itertools.count(1)


class WeightSync:
    """Sync the weights of `model` (a proxy in one device group) into `sampler` (a proxy in another).

    `adapter_name` / `sampler_adapter_name` are passed to `CheckpointEngineManager`; `bucket_bytes` to the
    broadcast engine. The side process group is created lazily on the first `sync_weights` and released by
    `close()` (or when the runtime shuts down the groups).
    """

    def __init__(
        self,
        model: Any,
        sampler: Any,
        *,
        adapter_name: str | None = None,
        sampler_adapter_name: str | None = None,
        bucket_bytes: int = 256 << 20,
    ) -> None:
        if not isinstance(model, ComponentProxy) or not isinstance(sampler, ComponentProxy):
            raise TwinkleError(
                'WeightSync connects components hosted in two device groups (built with '
                'remote_group=...); in one process use CheckpointEngineManager(model=, sampler=).'
            )
        if model._group is sampler._group:
            raise TwinkleError(
                f'model and sampler are both in device group {model._group.name!r}; WeightSync needs '
                'separate groups (in one process use CheckpointEngineManager(model=, sampler=)).'
            )
        self.model, self.sampler = model, sampler
        self.options = {'adapter_name': adapter_name, 'sampler_adapter_name': sampler_adapter_name}
        self.bucket_bytes = bucket_bytes
        self._key: str | None = None

    def sync_weights(self, merge_and_sync: bool = False) -> dict[str, Any]:
        """Move the model's current weights into every sampler rank; returns the sender's `SyncReport` fields."""
        if self._key is None:
            self._open()
        model_group, sampler_group = self.model._group, self.sampler._group
        send = [w.run.remote(_sync_weights, self._key, merge_and_sync) for w in model_group.workers]
        receive = [w.run.remote(_sync_weights, self._key, merge_and_sync) for w in sampler_group.workers]
        return wait_across(
            [
                (model_group, send, 'WeightSync.sync_weights (send)'),
                (sampler_group, receive, 'WeightSync.sync_weights (receive)'),
            ]
        )[0][0]

    def _open(self) -> None:
        import ray

        model_group, sampler_group = self.model._group, self.sampler._group
        for group in (model_group, sampler_group):
            group.check_usable()
        key = f'twinkle-sync-{next(_names)}'
        addr, port = ray.get(model_group.workers[0].rendezvous_address.remote())
        world = 1 + sampler_group.world_size
        refs = [
            model_group.workers[0].run.remote(
                _open_endpoint, key, self.model._obj_id, 'model', addr, port, 0, world, self.options, self.bucket_bytes
            )
        ]
        peers = [
            w.run.remote(_open_export_peer, key, self.model._obj_id, self.options, self.bucket_bytes)
            for w in model_group.workers[1:]
        ]
        refs += [
            w.run.remote(
                _open_endpoint,
                key,
                self.sampler._obj_id,
                'sampler',
                addr,
                port,
                1 + r,
                world,
                self.options,
                self.bucket_bytes,
            )
            for r, w in enumerate(sampler_group.workers)
        ]
        wait_across([(model_group, refs[:1] + peers, 'WeightSync.open'), (sampler_group, refs[1:], 'WeightSync.open')])
        self._key = key

    def close(self) -> None:
        if self._key is None:
            return
        import ray

        workers = [*self.model._group.workers, *self.sampler._group.workers]
        ray.get([w.run.remote(_close_endpoint, self._key) for w in workers])
        self._key = None


# ---- executed inside the actors (GroupWorker.run passes the worker first) -------------------------------------
def _open_endpoint(
    worker: Any,
    key: str,
    obj_id: int,
    side: str,
    addr: str,
    port: int,
    rank: int,
    world: int,
    options: dict[str, Any],
    bucket_bytes: int,
) -> None:
    from twinkle_core.weight_sync import CheckpointEngineManager

    pg = side_process_group(addr, port, rank, world)
    engine = _side_group_engine(pg, rank, bucket_bytes)
    component = worker.objects[obj_id]
    manager = CheckpointEngineManager(
        **({'model': component} if side == 'model' else {'sampler': component}),
        engine=engine,
        bucket_bytes=bucket_bytes,
        **options,
    )
    worker.objects[key] = manager


def _open_export_peer(worker: Any, key: str, obj_id: int, options: dict[str, Any], bucket_bytes: int) -> None:
    """A model rank other than the export rank: it takes part in the export's collective gathers and sends
    nothing (its manager's engine is never used)."""
    from twinkle_core.weight_sync import CheckpointEngineManager

    worker.objects[key] = CheckpointEngineManager(
        model=worker.objects[obj_id], engine=InProcessCheckpointEngine(), bucket_bytes=bucket_bytes, **options
    )


def _sync_weights(worker: Any, key: str, merge_and_sync: bool) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(worker.objects[key].sync_weights(merge_and_sync=merge_and_sync))


def _close_endpoint(worker: Any, key: str) -> None:
    manager = worker.objects.pop(key, None)
    if manager is not None:
        manager.engine.close()


def side_process_group(addr: str, port: int, rank: int, world: int) -> Any:
    """A torch.distributed process group over `world` processes that already belong to other (default) groups.

    torch has no public API for a group outside the default one, so this uses the construction OpenRLHF and
    others rely on: a TCPStore rendezvous plus ``_new_process_group_helper``, registered with identity ranks so
    the collective functions accept it (``src`` = rank within this group).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    backend = 'nccl' if torch.cuda.is_available() else 'gloo'
    store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=SYNC_TIMEOUT)
    prefix = dist.PrefixStore(f'twinkle-sync-{addr}-{port}', store)
    group_name = f'twinkle-sync-{addr}-{port}'
    # `group_name` is typed as torch's `GroupName`, a typing-only NewType of str (not in every torch >= 2.4)
    pg, _ = c10d._new_process_group_helper(
        world,
        rank,
        [],
        dist.Backend(backend),
        prefix,
        group_name=group_name,  # type: ignore[arg-type]
        timeout=SYNC_TIMEOUT,
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg


def _side_group_engine(pg: Any, rank: int, bucket_bytes: int) -> Any:
    from twinkle_core.weight_sync.broadcast import BroadcastCheckpointEngine

    class SideGroupBroadcastEngine(BroadcastCheckpointEngine):
        """The broadcast engine on a side group: its rank is the rank within that group, not the default one."""

        @property
        def rank(self) -> int:
            return rank

        def close(self) -> None:
            import torch.distributed as dist

            dist.destroy_process_group(self.group)

    return SideGroupBroadcastEngine(src=0, group=pg, bucket_bytes=bucket_bytes)
