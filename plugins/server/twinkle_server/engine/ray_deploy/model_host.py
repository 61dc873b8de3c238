"""`RayModelHost`: one hosted base model whose training runs in a Ray device group and whose sampling runs in
data-parallel sampler replicas (each its own device group), behind the same `ModelHost` interface the service
uses.

- **Training** (`TrainingHost` on every rank of the model's training group): the backend named in the config,
  under the group's mesh. Calls go to every rank; results come from rank 0, per-row log-probs from the data
  leaders in rank order.
- **Sampling** (`SamplerHost` per replica): a batch of sample jobs is split over the live replicas, keeping the
  jobs of one checkpoint on one replica (its adapter is loaded once there), and run concurrently. Sampler
  replicas load adapters from the checkpoint directories the training side saved, so the data directory must be
  on storage every node sees (a shared filesystem) when replicas run on other nodes.
- **Faults**: when the training workers die during a call, that call (every request in it) fails with a 503
  naming the model and what happened, the group is restarted, and every adapter is rebuilt and restored from its
  newest committed checkpoint that still exists (saved or loaded; optimizer state included when it was saved),
  or re-initialised from its seed when it has none; steps since then are lost and the error says so. A dead
  sampler replica is restarted and its jobs run again on the live replicas. Other base models have their own
  groups and keep serving throughout.
"""

from __future__ import annotations

import logging
import os
import zlib
from typing import Any, Callable

from twinkle_core.types import SampleResponse
from twinkle_server.config import ModelSpec
from twinkle_server.engine.model_host.base import LoraSpec, ModelHost, OptimStep, SampleJob, TrainBatch, TrainResult
from twinkle_server.engine.ray_deploy.hosted_group import HostedGroup, WorkersLost
from twinkle_server.engine.ray_deploy.hosts import SamplerHost, TrainingHost
from twinkle_server.errors import ApiError

logger = logging.getLogger(__name__)

MAX_REMEMBERED = 8  # committed checkpoints remembered per adapter for restores


class RayModelHost(ModelHost):
    """A base model served from Ray device groups (module docstring). Blocking calls: the service calls hosts
    from the model's worker thread only."""

    def __init__(self, spec: ModelSpec, model_dir: str, env: dict[str, str]) -> None:
        self.spec = spec
        self.base_model, self.model_dir = spec.name, model_dir
        self.training = HostedGroup(
            spec.train_group.device_group(f'{spec.name}/train'),
            spec.device_mesh(),
            TrainingHost,
            (spec.name, model_dir),
            {'backend': spec.backend, 'backend_args': dict(spec.backend_args), 'device': spec.device},
            env,
        )
        self.replicas = [
            HostedGroup(
                spec.sampler_group.device_group(f'{spec.name}/sampler-{i}'),
                None,
                SamplerHost,
                (model_dir,),
                {'sampler': spec.sampler, 'sampler_args': dict(spec.sampler_args), 'device': spec.device},
                env,
            )
            for i in range(spec.sampler_replicas)
        ]
        self._adapters: dict[str, LoraSpec] = {}
        #: adapter -> its committed checkpoints (directory, with optimizer), newest last
        self._checkpoints: dict[str, list[tuple[str, bool]]] = {}
        for group in (self.training, *self.replicas):
            group.start()
        info = self.training.call('info')[0].unwrap()
        self.max_context_length = int(info['max_context_length'])
        self.backend_name, self.max_adapters = info['backend_name'], info['max_adapters']

    # ---- training ------------------------------------------------------------------------------------------
    def _train(self, method: str, *args: Any) -> list[Any]:
        """Per-rank values of `method` on the training group; a lost group is restarted and restored first."""
        try:
            outcomes = self.training.call(method, *args)
        except WorkersLost as exc:
            self._recover(str(exc))
            raise ApiError(
                503,
                f'{self.base_model}: the training workers died during {method} ({exc}); they were '
                f'restarted and every adapter was restored from its last saved checkpoint (or '
                f're-initialised if it had none): steps after that checkpoint are lost. Send the '
                f'request again.',
            ) from None
        return [o.unwrap() for o in outcomes]

    def _recover(self, reason: str) -> None:
        logger.error(
            '%s: training workers lost (%s); restarting and restoring %d adapter(s)',
            self.base_model,
            reason,
            len(self._adapters),
        )
        self.training.restart()
        for adapter, lora in self._adapters.items():
            try:
                self.training.call('add_adapter', adapter, lora)[0].unwrap()
                saved = [c for c in self._checkpoints.get(adapter, []) if os.path.isdir(c[0])]
                if saved:
                    directory, optimizer = saved[-1]
                    self.training.call('load_state', adapter, directory, optimizer)[0].unwrap()
                logger.warning(
                    '%s: adapter %s restored from %s',
                    self.base_model,
                    adapter,
                    saved[-1][0] if saved else 'its initial weights (it was never saved)',
                )
            except Exception:  # noqa: BLE001 - the other adapters are still restored
                logger.exception('%s: restoring adapter %s failed', self.base_model, adapter)

    def add_adapter(self, adapter: str, lora: LoraSpec) -> None:
        self._train('add_adapter', adapter, lora)
        self._adapters[adapter] = lora

    def remove_adapter(self, adapter: str) -> None:
        self._train('remove_adapter', adapter)
        self._adapters.pop(adapter, None)
        self._checkpoints.pop(adapter, None)

    def has_adapter(self, adapter: str) -> bool:
        return adapter in self._adapters

    def forward_backward(self, batches: list[TrainBatch]) -> list[TrainResult | BaseException]:
        per_rank = self._train('forward_backward', batches)
        leaders = self._data_leaders()
        if len(leaders) == 1:
            return per_rank[0]
        merged: list[TrainResult | BaseException] = []
        for i, first in enumerate(per_rank[0]):
            failed = next((r[i] for r in per_rank if isinstance(r[i], BaseException)), None)
            if failed is not None:
                merged.append(failed)
                continue
            logprobs = [row for rank in leaders for row in per_rank[rank][i].logprobs]
            merged.append(TrainResult(first.loss, logprobs, first.metrics))
        return merged

    def _data_leaders(self) -> list[int]:
        mesh = self.training.mesh
        if mesh is None:
            return [0]
        return [r for r in range(mesh.world_size) if mesh.is_data_leader(r)]

    def pass_stats(self) -> dict[str, int]:
        return self._train('pass_stats')[0]

    def optim_step(self, adapter: str, step: OptimStep) -> dict[str, float]:
        return self._train('optim_step', adapter, step)[0]

    def save_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        self._train('save_state', adapter, directory, optimizer)

    def checkpoint_written(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        self._remember(adapter, directory, optimizer)

    def load_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        self._train('load_state', adapter, directory, optimizer)
        self._remember(adapter, directory, optimizer)

    def _remember(self, adapter: str, directory: str, optimizer: bool) -> None:
        """Record a committed checkpoint of `adapter` (a few, newest last: a later one may be deleted)."""
        history = [c for c in self._checkpoints.get(adapter, []) if c[0] != directory]
        self._checkpoints[adapter] = (history + [(directory, optimizer)])[-MAX_REMEMBERED:]

    def native_call(self, adapter: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        return self._train('native_call', adapter, method, args, kwargs)[0]

    # ---- sampling ------------------------------------------------------------------------------------------
    def sample(
        self, jobs: list[SampleJob], should_stop: Callable[[int], bool] | None = None
    ) -> list[SampleResponse | BaseException]:
        """Jobs spread over the replicas (one checkpoint's jobs on one replica), run concurrently; a replica that
        died is restarted and its jobs run again on the replicas alive. `should_stop` is not sent to the replicas
        (other processes): a cancelled job runs to its end there and its answer is discarded."""
        out: list[SampleResponse | BaseException | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        for _ in range(2):  # the second round re-runs the jobs of replicas that died in the first
            if not pending:
                break
            pending = self._sample_round(jobs, pending, out)
        for i in pending:
            out[i] = ApiError(
                503, f'{self.base_model}: the sampler replicas died while sampling; send the request again'
            )
        return out  # type: ignore[return-value]

    def _sample_round(self, jobs: list[SampleJob], idx: list[int], out: list[Any]) -> list[int]:
        """Run `idx` once; fills `out` and returns the jobs whose replica died."""
        shares: dict[int, list[int]] = {}
        for n, i in enumerate(idx):  # one checkpoint -> one replica; base-model jobs round-robin
            directory = jobs[i].adapter_dir
            key = zlib.crc32(directory.encode()) if directory is not None else n
            shares.setdefault(key % len(self.replicas), []).append(i)
        running = {r: self.replicas[r].submit('sample', [jobs[i] for i in share]) for r, share in shares.items()}
        lost: list[int] = []
        for r, refs in running.items():
            replica = self.replicas[r]
            try:
                results = replica.collect(refs, 'sample')[0].unwrap()
            except WorkersLost as exc:
                logger.error('%s: sampler replica %s lost (%s); restarting it', self.base_model, replica.name, exc)
                replica.restart()
                lost += shares[r]
                continue
            except Exception as exc:  # noqa: BLE001 - the whole share failed (e.g. bad jobs): fail those only
                results = [exc] * len(shares[r])
            for i, result in zip(shares[r], results):
                out[i] = result
        return lost

    # ---- life cycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        for group in (self.training, *self.replicas):
            group.shutdown()
