"""`LocalModelHost`: a base model hosted in this process -- a training backend chosen by registry name (kind
`model`; default `MultiLoraTransformersModel`, whose `PassPlanner` splits tenants' queued work into passes) + a
sampler chosen by registry name (`TorchSampler` by default, or e.g. `vLLMSampler`), built and driven only through
the `Model` and `Sampler` interfaces and their declared capabilities (`construction`), never by class name.

A backend that declares `ModelCapabilities.mixed_adapters` gets every queued adapter's rows in one call; any other
is called once per adapter (its `max_adapters` bounds the training models a server hosts on it). The sampler holds
its own copy of the base weights, so sampling never sees half-updated training weights; its adapters are loaded
from saved checkpoint directories (what a client samples is exactly what was saved) into a bounded pool of slots,
least recently used first out, so a long RL run does not grow memory without limit. A batch names its loss as
registered (kind `loss`), or carries an uploaded graph (`GraphLoss`).

`AdapterSampler` is the sampling half on its own: the Ray deployment runs it in sampler replicas.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import torch

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.loss.candidates import ROW_CANDIDATE_LOGPS
from twinkle_core.model import Model
from twinkle_core.sampler import Sampler
from twinkle_core.sampler.prompts import check_prompt_scoring
from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_server.engine.custom_loss.graph_loss import GraphLoss
from twinkle_server.engine.model_host.base import (
    DimuonStep,
    LoraSpec,
    ModelHost,
    OptimStep,
    SampleJob,
    TrainBatch,
    TrainResult,
)
from twinkle_server.engine.model_host.construction import build_backend, build_sampler
from twinkle_server.errors import ApiError, unprocessable

_GLOBAL_RNG = threading.Lock()  # held while an adapter is initialised from a seeded global torch RNG


class LocalModelHost(ModelHost):
    """`backend`: a registered model name built on `model_dir` with `backend_args` (plus `device` and
    `device_mesh` where it declares it takes them: `construction.build_backend`), or a ready `Model`. `sampler`: a
    registered sampler name built on `model_dir` with `sampler_args` (plus `device` where it declares it), a ready
    `Sampler` (e.g. one vLLM sampler shared across tests), or None for a training-only host (sampling then happens
    elsewhere, e.g. in the sampler replicas of a Ray deployment). `max_sampler_adapters` bounds the adapters the
    sampler holds at once (see `AdapterSampler`)."""

    def __init__(
        self,
        base_model: str,
        model_dir: str,
        *,
        device: str | None = None,
        max_sampler_adapters: int = 32,
        backend: str | Model = 'MultiLoraTransformersModel',
        backend_args: dict[str, Any] | None = None,
        device_mesh: Any = None,
        sampler: str | Sampler | None = 'TorchSampler',
        sampler_args: dict[str, Any] | None = None,
    ) -> None:
        self.base_model, self.model_dir = base_model, str(model_dir)
        self.model: Model = (
            backend
            if isinstance(backend, Model)
            else build_backend(
                backend, self.model_dir, device=device, device_mesh=device_mesh, backend_args=backend_args
            )
        )
        self.sampling = (
            None
            if sampler is None
            else AdapterSampler(
                sampler, self.model_dir, device=device, sampler_args=sampler_args, max_adapters=max_sampler_adapters
            )
        )
        self.max_context_length = int(self.model.model_info().get('max_length') or 4096)
        self.backend_name, self.max_adapters = type(self.model).__name__, self.model.capabilities.max_adapters
        self._losses: dict[str, tuple[str, tuple]] = {}  # adapter -> the loss currently set (avoid re-resolving)

    # ---- adapters ------------------------------------------------------------------------------------------
    def add_adapter(self, adapter: str, lora: LoraSpec) -> None:
        # lora.seed: the same initial weights on every backend. Seeding goes through torch's global RNG, which the
        # hosts of other base models (other worker threads) use too: one at a time, or they reseed each other.
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            if lora.seed is not None:
                torch.manual_seed(lora.seed)
            self.model.add_adapter_to_model(
                adapter, lora.peft_config(), gradient_accumulation_steps=lora.gradient_accumulation_steps
            )
        try:
            if lora.optimizer == 'dimuon':  # Tinker's defaults; every optim_step sets lr and beta1 again
                self.model.set_optimizer('Dimuon', lr=1e-4, beta1=0.9, adapter_name=adapter)
            elif lora.optimizer == 'adamw':
                self.model.set_optimizer(
                    'AdamW', lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, adapter_name=adapter
                )
            else:
                raise unprocessable(f'optimizer {lora.optimizer!r} is not offered; use adamw or dimuon')
        except TwinkleError as exc:  # a backend that cannot build this optimizer (e.g. Megatron: AdamW only)
            self.model.remove_adapter(adapter)
            raise unprocessable(
                f'optimizer {lora.optimizer!r} is not available on the backend of this model: {exc}'
            ) from None
        except ApiError:
            self.model.remove_adapter(adapter)
            raise

    def remove_adapter(self, adapter: str) -> None:
        if self.has_adapter(adapter):
            self.model.remove_adapter(adapter)
        self._losses.pop(adapter, None)

    def has_adapter(self, adapter: str) -> bool:
        return adapter in self.model.list_adapters()

    # ---- training ------------------------------------------------------------------------------------------
    def _set_loss(self, batch: TrainBatch) -> None:
        if batch.graph is not None:  # an uploaded graph (engine.custom_loss.program): built here, keyed by its digest
            key: tuple[str, tuple] = ('', (batch.graph['digest'],))
            if self._losses.get(batch.adapter) != key:
                self.model.set_loss(GraphLoss(batch.graph), adapter_name=batch.adapter)
                self._losses[batch.adapter] = key
            return
        key = (batch.loss, tuple(sorted(batch.loss_args.items())))
        if self._losses.get(batch.adapter) != key:
            try:
                self.model.set_loss(batch.loss, adapter_name=batch.adapter, **batch.loss_args)
            except TypeError as exc:
                raise unprocessable(f'loss arguments {batch.loss_args} are not valid for {batch.loss}: {exc}') from None
            self._losses[batch.adapter] = key

    def forward_backward(self, batches: list[TrainBatch]) -> list[TrainResult | BaseException]:
        results: dict[int, TrainResult | BaseException] = {}
        for forward_only in (False, True):
            group: dict[str, int] = {}
            for i, b in enumerate(batches):
                if b.forward_only != forward_only:
                    continue
                try:
                    self._set_loss(b)
                    group[b.adapter] = i
                except Exception as exc:  # noqa: BLE001 - only this tenant fails
                    results[i] = exc
            if not group:
                continue
            run = self.model.forward_only if forward_only else self.model.forward_backward
            for adapter, out in self._run(run, {a: batches[i].rows for a, i in group.items()}).items():
                results[group[adapter]] = out
        return [results[i] for i in range(len(batches))]

    def _run(self, run: Any, rows: dict[str, list]) -> dict[str, TrainResult | BaseException]:
        """`run` over every adapter's rows: one call when the backend mixes adapters, else one call each."""
        if self.model.capabilities.mixed_adapters:
            out = run(inputs=rows, return_errors=True)
            return {adapter: _result(out[adapter]) for adapter in rows}
        results: dict[str, TrainResult | BaseException] = {}
        for adapter, adapter_rows in rows.items():
            try:
                results[adapter] = _result(run(inputs=adapter_rows, adapter_name=adapter))
            except Exception as exc:  # noqa: BLE001 - only this tenant fails
                results[adapter] = ApiError(422, f'step failed: {exc}')
        return results

    def pass_stats(self) -> dict[str, int]:
        return dict(self.model.model_info().get('pass_stats') or {})

    def optim_step(self, adapter: str, step: OptimStep) -> dict[str, float]:
        try:
            if isinstance(step, DimuonStep):
                self.model.update_optimizer(lr=step.learning_rate, beta1=step.beta1, adapter_name=adapter)
            else:
                self.model.update_optimizer(
                    lr=step.learning_rate,
                    betas=(step.beta1, step.beta2),
                    eps=step.eps,
                    weight_decay=step.weight_decay,
                    adapter_name=adapter,
                )
        except InvalidInputError as exc:  # the step's family is not the adapter's optimizer
            raise unprocessable(f'optim_step: {exc}') from None
        out = self.model.clip_grad_and_step(
            step.grad_clip_norm if step.grad_clip_norm > 0 else None, adapter_name=adapter
        )
        if out.get('skipped'):
            raise ApiError(
                422,
                f'optimizer step skipped: the gradient norm is not finite ({out.get("grad_norm")}); '
                f'gradients were dropped, weights are unchanged',
            )
        norm = out.get('grad_norm')
        metrics = {'learning_rate:mean': step.learning_rate}
        if norm is not None and math.isfinite(norm):
            metrics['grad_norm:mean'] = float(norm)
        return metrics

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        path = Path(directory)
        self.model.save(path.name, output_dir=str(path.parent), save_optimizer=optimizer, adapter_name=adapter)

    def load_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        self.model.load(directory, load_optimizer=optimizer, adapter_name=adapter)

    # ---- sampling ------------------------------------------------------------------------------------------
    @property
    def sampler(self) -> Sampler:
        if self.sampling is None:
            raise ApiError(503, f'{self.base_model}: this host trains only; its sampler runs elsewhere')
        return self.sampling.sampler

    def sample(
        self, jobs: list[SampleJob], should_stop: Callable[[int], bool] | None = None
    ) -> list[SampleResponse | BaseException]:
        if self.sampling is None:
            raise ApiError(503, f'{self.base_model}: this host trains only; its sampler runs elsewhere')
        return self.sampling.sample(jobs, should_stop)

    def native_call(self, adapter: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if method == 'set_loss' or method == 'set_optimizer':
            self._losses.pop(adapter, None)
        return getattr(self.model, method)(*args, adapter_name=adapter, **kwargs)


class AdapterSampler:
    """A sampler plus the adapters it serves: LoRA weights are loaded from saved checkpoint directories (what a
    client samples is exactly what was saved) into a bounded pool of slots, least recently used first out, so a
    long RL run does not grow memory without limit. Planned by the sampler's declared `capabilities`:
    `max_adapters` further caps the slots, `per_row_adapters` / `max_adapters_per_call` bound the adapters one
    `sample` call mixes, and a sampler is never asked for prompt scores or top-k widths it does not declare
    (`prompt_logprobs`, `prompt_top_logprobs`, `max_top_logprobs`, ...: those jobs fail with 422). A sampler that
    declares `stops_rows` is told which jobs were cancelled while it runs (``should_stop=``)."""

    def __init__(
        self,
        sampler: str | Sampler,
        model_dir: str,
        *,
        device: str | None = None,
        sampler_args: dict[str, Any] | None = None,
        max_adapters: int = 32,
    ) -> None:
        self.sampler = (
            sampler
            if isinstance(sampler, Sampler)
            else build_sampler(sampler, model_dir, device=device, sampler_args=sampler_args)
        )
        self.capabilities = caps = self.sampler.capabilities
        self.max_adapters = min(max_adapters, caps.max_adapters) if caps.max_adapters else max_adapters
        #: distinct adapters one `sample` call may mix (1: the sampler takes one adapter per call)
        per_call = caps.max_adapters_per_call or self.max_adapters
        self.per_call = min(self.max_adapters, per_call) if caps.per_row_adapters else 1
        self._slots: OrderedDict[str, str] = OrderedDict()  # checkpoint directory -> sampler adapter name

    def _slot(self, directory: str) -> str:
        """The sampler adapter holding `directory`'s weights, loading it (into the LRU slot) if needed. Keyed by
        the directory's identity too, so a checkpoint overwritten under the same name is reloaded."""
        st = os.stat(directory)
        directory = f'{directory}#{st.st_ino}:{st.st_mtime_ns}'
        if directory in self._slots:
            self._slots.move_to_end(directory)
            return self._slots[directory]
        if len(self._slots) < self.max_adapters:
            name = f'slot-{len(self._slots)}'
        else:
            _, name = self._slots.popitem(last=False)
        self._slots[directory] = name  # recorded before loading: a failed load leaves the slot to be reloaded
        try:
            self.sampler.add_adapter(name, path=directory.rsplit('#', 1)[0])
        except Exception:
            del self._slots[directory]
            raise
        return name

    def sample(
        self, jobs: list[SampleJob], should_stop: Callable[[int], bool] | None = None
    ) -> list[SampleResponse | BaseException]:
        """Jobs with the same sampling settings share one `sample` call (adapters mixed per row where the sampler
        declares it can). Seeded copies of one prompt go to separate calls: a sampler tells identical prompts of
        one call apart (`prompt_occurrences`), and each request must get the completions it gets alone.
        `should_stop(job index)` (a cancelled job) reaches a sampler that declares `stops_rows`, which stops the
        job's rows at its next decode step; another sampler runs them to their end."""
        out: list[SampleResponse | BaseException | None] = [None] * len(jobs)
        groups: dict[tuple[str, int], list[int]] = {}
        copies: dict[tuple[str, str | None, tuple[int, ...]], int] = {}
        asked: dict[int, SamplingParams] = {}  # each job's params as the sampler takes them (the job is left as is)
        for i, job in enumerate(jobs):
            params = job.params.model_copy(
                update={'num_samples': job.num_samples, 'prompt_logprobs': job.prompt_logprobs, 'logprobs': True}
            )
            try:  # what the sampler does not declare (or a prompt cannot take) fails this job alone, with a 4xx
                check_prompt_scoring(
                    f'the sampler of this model ({type(self.sampler).__name__})',
                    self.capabilities,
                    [job.prompt],
                    params,
                )
            except InvalidInputError as exc:
                out[i] = unprocessable(str(exc))
                continue
            asked[i] = params
            key = params.model_dump_json()
            copy = (key, job.adapter_dir, tuple(job.prompt))
            nth = copies[copy] = copies.get(copy, -1) + 1
            groups.setdefault((key, nth if params.seed is not None else 0), []).append(i)
        for idx in (chunk for group in groups.values() for chunk in self._by_adapter_budget(jobs, group)):
            try:
                adapters = [self._slot(d) if (d := jobs[i].adapter_dir) is not None else None for i in idx]
                stops: dict[str, Any] = (
                    {}
                    if should_stop is None or not self.capabilities.stops_rows
                    else {'should_stop': _in_call(should_stop, idx)}
                )
                responses = self.sampler.sample(
                    [jobs[i].row() for i in idx],
                    asked[idx[0]],
                    adapter_name=adapters if self.capabilities.per_row_adapters else adapters[0],
                    **stops,
                )
                for i, r in zip(idx, responses):
                    out[i] = r
            except Exception as exc:  # noqa: BLE001
                for i in idx:
                    out[i] = exc
        return out  # type: ignore[return-value]

    def _by_adapter_budget(self, jobs: list[SampleJob], idx: list[int]) -> list[list[int]]:
        """Split `idx` so no chunk needs more distinct adapters than one call may mix (`per_call`); a sampler
        without per-row adapters gets chunks of one adapter (or of the base model) each."""
        if not self.capabilities.per_row_adapters:
            alike: dict[str | None, list[int]] = {}
            for i in idx:
                alike.setdefault(jobs[i].adapter_dir, []).append(i)
            return list(alike.values())
        chunks: list[list[int]] = [[]]
        dirs: set[str] = set()
        for i in idx:
            d = jobs[i].adapter_dir
            if d is not None and d not in dirs and len(dirs) >= self.per_call:
                chunks.append([])
                dirs = set()
            if d is not None:
                dirs.add(d)
            chunks[-1].append(i)
        return chunks


def _in_call(should_stop: Callable[[int], bool], idx: list[int]) -> Callable[[int], bool]:
    """`should_stop` over job indices as a predicate over the prompts of one sampler call (prompt p is job
    `idx[p]`)."""
    return lambda p: should_stop(idx[p])


def _result(out: dict[str, Any]) -> TrainResult | BaseException:
    """A backend's per-adapter result as a `TrainResult`; a loss's per-row candidate log-probs (soft targets, rank-2
    custom losses: `twinkle_core.loss.candidates`) replace the rows' log-probs, as [n][K] lists (row 0 a dummy)."""
    if 'error' in out:
        err = out['error']
        return ApiError(422, f'{err.get("stage", "step")} failed: {err.get("message", err)}')
    raw = dict(out.get('metrics') or {})
    rows = raw.pop(ROW_CANDIDATE_LOGPS, None)
    metrics = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float))}
    if rows is not None:
        logprobs: list[list[Any]] = [[[]] + list(r) for r in rows]
    else:
        logprobs = [list(map(float, lp)) for lp in out['logprobs']]
    return TrainResult(float(out['loss']), logprobs, metrics)
