"""What runs inside the Ray actors of a deployment: the training half and the sampling half of a model host.

Both are built by `twinkle_ray.group.WorkerGroup.construct` on every rank of their device group. Their methods
never raise: they return an `Outcome`, so that errors keep their type (an `ApiError`'s status reaches the
client) and a Ray-level failure always means the actor itself is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from twinkle_core.mesh import DeviceMesh, split_for_dp
from twinkle_server.engine.model_host.base import LoraSpec, OptimStep, SampleJob, TrainBatch
from twinkle_server.engine.model_host.local import AdapterSampler, LocalModelHost


@dataclass
class Outcome:
    """A host method's return value, or the exception it raised (re-raised by the caller)."""

    value: Any = None
    error: BaseException | None = None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Outcome:
    try:
        return Outcome(fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - carried back to the front
        return Outcome(error=exc)


class TrainingHost:
    """One rank of a base model's training group: a training-only `LocalModelHost` (the backend built under the
    group's `device_mesh`, which it must declare it takes). With several data ranks, each rank trains its
    contiguous slice of every batch's rows (the backend all-reduces gradients, loss and metrics); per-row log-probs
    come back per data rank and are concatenated by the front in rank order."""

    def __init__(
        self,
        base_model: str,
        model_dir: str,
        *,
        backend: str,
        backend_args: dict[str, Any],
        device: str | None = None,
        device_mesh: DeviceMesh | None = None,
    ) -> None:
        self.mesh = device_mesh
        self.host = LocalModelHost(
            base_model,
            model_dir,
            device=device,
            backend=backend,
            backend_args=dict(backend_args),
            device_mesh=device_mesh if device_mesh is not None and device_mesh.world_size > 1 else None,
            sampler=None,
        )

    def info(self) -> Outcome:
        h = self.host
        return Outcome(
            {'max_context_length': h.max_context_length, 'backend_name': h.backend_name, 'max_adapters': h.max_adapters}
        )

    def add_adapter(self, adapter: str, lora: LoraSpec) -> Outcome:
        return _outcome(self.host.add_adapter, adapter, lora)

    def remove_adapter(self, adapter: str) -> Outcome:
        return _outcome(self.host.remove_adapter, adapter)

    def forward_backward(self, batches: list[TrainBatch]) -> Outcome:
        return _outcome(self.host.forward_backward, [self._my_slice(b) for b in batches])

    def pass_stats(self) -> Outcome:
        return _outcome(self.host.pass_stats)

    def optim_step(self, adapter: str, step: OptimStep) -> Outcome:
        return _outcome(self.host.optim_step, adapter, step)

    def save_state(self, adapter: str, directory: str, optimizer: bool) -> Outcome:
        return _outcome(self.host.save_state, adapter, directory, optimizer=optimizer)

    def load_state(self, adapter: str, directory: str, optimizer: bool) -> Outcome:
        return _outcome(self.host.load_state, adapter, directory, optimizer=optimizer)

    def native_call(self, adapter: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Outcome:
        return _outcome(self.host.native_call, adapter, method, args, kwargs)

    def _my_slice(self, batch: TrainBatch) -> TrainBatch:
        mesh = self.mesh
        if mesh is None or mesh.data_world_size == 1:
            return batch
        import torch.distributed as dist

        rank = mesh.data_rank(dist.get_rank())
        rows = split_for_dp(list(batch.rows), mesh.data_world_size)[rank]
        return replace(batch, rows=rows)


class SamplerHost:
    """One sampler replica: a sampler plus the adapters it has loaded from checkpoint directories."""

    def __init__(
        self,
        model_dir: str,
        *,
        sampler: str,
        sampler_args: dict[str, Any],
        device: str | None = None,
        max_adapters: int = 32,
    ) -> None:
        self.sampling = AdapterSampler(
            sampler, model_dir, device=device, sampler_args=sampler_args, max_adapters=max_adapters
        )

    def sample(self, jobs: list[SampleJob]) -> Outcome:
        return _outcome(self.sampling.sample, jobs)
