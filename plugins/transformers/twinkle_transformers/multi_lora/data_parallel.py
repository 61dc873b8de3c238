"""The multi-tenant engine on several ranks (``device_mesh=`` with ``dp_size`` / ``fsdp_size`` > 1): `DataRanks`.

Every rank holds every adapter, whole; the frozen base is replicated on every rank (``dp``) or sharded by FSDP2
(``fsdp``; HSDP with both). A call's rows of each tenant are split across the ranks (each rank passes its own rows,
as under torchrun; a tenant may have no rows on some ranks). With a replicated base each rank runs its rows through
passes its own planner chooses: there is no collective inside a pass, so ranks may plan differently. With a sharded
base every forward and backward gathers the base's shards, so every rank runs the same passes
(`passes.lockstep_passes`). Either way the ranks meet once per call (`DataRanks.begin` / `DataRanks.finish`):

1. what each rank saw of each tenant is gathered (its error, or its loss weight, loss, metrics and counts). A tenant
   rejected on any rank is rejected on every rank, with that rank's error: nothing of it is applied anywhere;
2. each accepted tenant's gradients of the call are combined exactly, ``sum_r (w_r / W) * g_r``, where ``w_r`` is
   its loss weight on rank r (loss tokens for ``token_mean``, rows for ``sequence_mean``; 1 a rank and ``W = 1``
   for ``sum``) and ``W = sum_r w_r``: the adapter gets the gradients one process would compute over all the
   call's rows, on every rank, so every rank's optimizer takes the same step (no gradient sync at the step);
3. its loss and metrics are the global batch's (weighted as the gradients), recorded as one micro-batch on every
   rank; each rank returns the log-probs of its own rows.

A tenant's gradients of earlier calls are set aside for the call (as one pass does) and restored after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceMesh
from twinkle_core.model.step_errors import TenantStepError
from twinkle_core.runtime import distributed
from twinkle_core.train.loss_step import loss_weight
from twinkle_core.train.state import TrainState
from twinkle_transformers import parallel
from twinkle_transformers.multi_lora.manager import MultiLoraManager
from twinkle_transformers.multi_lora.mixed_pass import TenantWork, put_back

_COUNTS = ('num_loss_tokens', 'num_correct', 'num_tokens')

_ADVICE = 'MultiLoraTransformersModel shards its base over fsdp_size and replicates it over dp_size: use those'
#: what to use instead of the mesh dimensions the multi-tenant engine does not implement (it implements dp, fsdp)
MESH_ADVICE: tuple[tuple[str, str], ...] = tuple((dim, _ADVICE) for dim in ('tp', 'cp', 'ep', 'pp'))


@dataclass
class RankCall:
    """One call between `DataRanks.begin` and `DataRanks.finish`: every rank's tenants, in one order, and the
    tenants of that order with no rows on this rank (set aside here so that their gradients can be combined)."""

    names: list[str]
    train: bool
    absent: list[TenantWork] = field(default_factory=list)
    earlier_grads: dict[str, list[torch.Tensor | None]] = field(default_factory=dict)  # set aside by `begin`


class DataRanks:
    """The data ranks of a `MultiLoraTransformersModel` (module docstring). Every method is collective: every rank
    calls it, in the same order."""

    def __init__(self, mesh: DeviceMesh, model: torch.nn.Module, manager: MultiLoraManager) -> None:
        if not distributed.is_initialized():
            raise MeshError(
                f'{mesh!r} needs a torch.distributed process group: call twinkle_core.initialize('
                "mode='local', global_device_mesh=mesh) under torchrun, or use the ray runtime."
            )
        distributed.init_process_group(mesh)  # checks the world size against the mesh
        self.mesh, self.manager = mesh, manager
        self.rank = distributed.get_rank()
        #: the frozen base is sharded (FSDP2 over fsdp, HSDP with dp): every rank must run the same passes
        self.sharded = mesh.size('fsdp') > 1
        if self.sharded:  # the adapters, added later, stay plain tensors outside FSDP: combined by `finish`
            parallel.apply_device_mesh(model, mesh)

    @classmethod
    def of(cls, mesh: DeviceMesh | None, model: torch.nn.Module, manager: MultiLoraManager) -> DataRanks | None:
        """`DataRanks` over `mesh`, or None for one rank (no mesh, or a mesh of one rank)."""
        return None if mesh is None or mesh.world_size == 1 else cls(mesh, model, manager)

    # ---- adapters ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def broadcast_adapter(self, name: str) -> None:
        """Give every rank rank 0's weights of adapter `name` (fresh adapters start from rank 0's random draw)."""
        import torch.distributed as dist

        for param in self.manager.parameters(name):
            dist.broadcast(param.data, src=0)

    def barrier(self) -> None:
        distributed.barrier()

    # ---- a call ----------------------------------------------------------------------------------------------
    def begin(
        self, work: list[TenantWork], errors: dict[str, TenantStepError], states: dict[str, TrainState], train: bool
    ) -> RankCall:
        """Agree on the call's tenants; set every tenant's earlier gradients aside (when `train`) and defer its
        metrics to `finish`."""
        local = [w.name for w in work] + list(errors)
        names = sorted({name for names in _all_gather(local) for name in names})
        present = {w.name for w in work}
        call = RankCall(names, train)  # tenants with no rows here (or rows rejected here) join with none
        call.absent = [TenantWork(n, states[n], []) for n in names if n not in present and n in states]
        for w in [*work, *call.absent]:
            w.summaries = []
            if train:  # kept on the call: a pass sets the work's own gradients aside again (`stash_grads`)
                params = self.manager.parameters(w.name)
                call.earlier_grads[w.name] = [p.grad for p in params]
                for p in params:
                    p.grad = None
        return call

    def finish(self, call: RankCall, work: list[TenantWork], errors: dict[str, TenantStepError]) -> list[TenantWork]:
        """Agree on each tenant's outcome and combine its gradients, loss and metrics over the ranks (module
        docstring). Returns `work` plus a result for every tenant with no rows here (its loss, no log-probs)."""
        by_name = {w.name: w for w in [*work, *call.absent]}
        for name, entries, total in self._agree(work, errors, call.names, by_name, call):
            w = by_name[name]
            if call.train:
                mine = next((e['weight'] for rank, e in entries if rank == self.rank), 0.0)
                self._combine_grads(w, mine / total if total else 0.0)
                self._restore(call, name, keep_new=True)
            w.result = {'logprobs': (w.result or {}).get('logprobs', []), **_global_result(entries, total)}
            w.summaries = None
            if 'loss' in w.result:
                counts = {k: sum(e['counts'][k] for _, e in entries if 'counts' in e) for k in _COUNTS}
                w.state.record({'loss': w.result['loss'], **counts}, is_training=call.train)
        return [*work, *(w for w in call.absent if w.result is not None)]

    def agree_losses(
        self, call: RankCall, work: list[TenantWork], errors: dict[str, TenantStepError]
    ) -> dict[str, float]:
        """`calculate_loss` of a pending forward: a tenant whose loss failed on any rank fails on every rank (its
        gradients are dropped at `backward`); returns the others' losses over every rank's rows."""
        by_name = {w.name: w for w in [*work, *call.absent]}
        agreed = self._agree(work, errors, call.names, by_name, None, pending=True)
        return {name: result['loss'] for name, e, t in agreed if 'loss' in (result := _global_result(e, t))}

    def _agree(
        self,
        work: list[TenantWork],
        errors: dict[str, TenantStepError],
        names: list[str],
        by_name: dict[str, TenantWork],
        call: RankCall | None,
        *,
        pending: bool = False,
    ) -> list[tuple[str, list[tuple[int, dict[str, Any]]], float]]:
        """Gather every rank's entries; reject on this rank each tenant some rank rejected (its gradients of
        `call` dropped); return ``(name, [(rank, entry)], loss denominator)`` of the others."""
        gathered = _all_gather(
            {w.name: _entry(w, pending=pending) for w in work} | {n: _error_entry(e) for n, e in errors.items()}
        )
        accepted = []
        for name in names:
            entries = [(rank, seen[name]) for rank, seen in enumerate(gathered) if name in seen]
            w = by_name.get(name)
            failed = next(((rank, e) for rank, e in entries if 'error' in e), None)
            if failed is None:
                assert w is not None  # a tenant no rank rejected is known to every rank
                reduction = getattr(w.state.loss, 'reduction', None)
                accepted.append((name, entries, 1.0 if reduction == 'sum' else sum(e['weight'] for _, e in entries)))
                continue
            if call is not None and call.train:
                self._restore(call, name, keep_new=False)
            if name in errors or (w is not None and w.error is not None):
                continue  # this rank's own error stands
            if w is not None:
                w.result, w.error = None, _agreed_error(name, *failed)
            else:
                errors[name] = _agreed_error(name, *failed)
        return accepted

    def abandon(self, call: RankCall) -> None:
        """Give every tenant of `call` back the gradients it had before `begin` (a call that will not finish)."""
        for name in list(call.earlier_grads):
            self._restore(call, name, keep_new=False)

    def _restore(self, call: RankCall, name: str, *, keep_new: bool) -> None:
        """Put `name`'s gradients from before the call back, plus the call's when `keep_new`."""
        earlier = call.earlier_grads.pop(name, None)
        if earlier is not None:
            put_back(self.manager.parameters(name), earlier, keep_new=keep_new)

    @torch.no_grad()
    def _combine_grads(self, w: TenantWork, scale: float) -> None:
        """This call's gradients of `w` (set apart by `begin`) become ``sum_r scale_r * g_r`` on every rank."""
        import torch.distributed as dist

        params = self.manager.parameters(w.name)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        flat.mul_(scale)
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()


def _all_gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _entry(w: TenantWork, *, pending: bool = False) -> dict[str, Any]:
    """What this rank saw of tenant `w`: its error, or its loss weight, loss, metrics and counts (nothing but a
    zero weight when its rows ran no loss). `pending`: read the summary a pass's `losses()` left in the result."""
    if w.error is not None:
        return _error_entry(w.error)
    result = w.result or {}
    summaries = [result['_summary']] if pending and '_summary' in result else list(w.summaries or ())
    if 'loss' not in result or not summaries:
        return {'weight': 0.0}
    counts = {k: sum(int(s[k]) for s in summaries) for k in _COUNTS}
    reduction = getattr(w.state.loss, 'reduction', None)
    weight = loss_weight(reduction, num_loss_tokens=counts['num_loss_tokens'], num_rows=len(w.rows))
    metrics = {k: float(v) for k, v in (result.get('metrics') or {}).items() if isinstance(v, (int, float))}
    return {'weight': weight, 'loss': float(result['loss']), 'metrics': metrics, 'counts': counts}


def _error_entry(error: TenantStepError) -> dict[str, Any]:
    return {'error': (error.stage, error.detail)}


def _agreed_error(name: str, rank: int, entry: dict[str, Any]) -> TenantStepError:
    stage, detail = entry['error']
    return TenantStepError(name, stage, f'{detail} (the rows of data rank {rank}; nothing was applied on any rank)')


def _global_result(entries: list[tuple[int, dict[str, Any]]], total: float) -> dict[str, Any]:
    """The loss (``sum_r w_r * loss_r / total``) and the metrics (weighted by ``w_r``) of the ranks' entries."""
    scored = [e for _, e in entries if 'loss' in e]
    if not scored:
        return {}
    weight = sum(e['weight'] for e in scored) or 1.0
    metrics: dict[str, float] = {}
    for e in scored:
        for key, value in e['metrics'].items():
            metrics[key] = metrics.get(key, 0.0) + value * e['weight'] / weight
    loss = sum(e['weight'] * e['loss'] for e in scored) / total if total else 0.0
    return {'loss': loss, 'metrics': metrics}
