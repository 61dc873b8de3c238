"""`MultiLoraTransformersModel`: the multi-tenant training engine (kind `model`, docs/architecture.md §4).

One frozen Hugging Face base model; any number of LoRA adapters added and removed at run time, each with its
own `LoraConfig`, optimizer, LR scheduler, loss, template, processor, gradient accumulation and metrics (a
`TrainState` per adapter). Every per-tenant method takes ``adapter_name=`` or runs inside
``with model.adapter(name):``.

    model = MultiLoraTransformersModel(model_id='Qwen/Qwen3-0.6B')
    model.add_adapter_to_model('alice', LoraConfig(r=8, target_modules='all-linear'))
    model.add_adapter_to_model('bob', LoraConfig(r=32, target_modules=['q_proj', 'v_proj']))
    model.set_optimizer('AdamW', lr=1e-4, adapter_name='alice') ...
    out = model.forward_backward(inputs={'alice': rows_a, 'bob': rows_b})  # shared passes (PassPlanner)
    model.clip_grad_and_step(adapter_name='alice'); model.clip_grad_and_step(adapter_name='bob')

A mixed call returns ``{adapter_name: {'loss', 'logprobs', 'metrics'}}``. A tenant whose micro-batch is rejected
(bad rows, a loss that raises or is not finite, non-finite gradients) changes nothing and is reported in a
`MixedStepError` (``.errors`` per tenant, ``.results`` of the others, whose step did happen) -- or inline as
``{'error': {...}}`` with ``return_errors=True``. A single-tenant call raises that tenant's `TenantStepError`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import torch

from twinkle_core.dispatch import remote_method
from twinkle_core.errors import InvalidInputError
from twinkle_core.hooks.emit import notify_model_loaded
from twinkle_core.kernel import apply_kernels
from twinkle_core.model.base import Model, ModelCapabilities, reject_unknown_kwargs
from twinkle_core.model.mesh_support import check_mesh_support
from twinkle_core.model.mixed_calls import split_by_tenant
from twinkle_core.model.step_errors import TenantStepError
from twinkle_core.runtime.context import global_device_mesh
from twinkle_core.train.model_loading import default_device
from twinkle_core.train.row_keywords import with_row_keywords
from twinkle_core.train.state import TrainState
from twinkle_core.train.state_methods import TrainStateMethods, reports_failure
from twinkle_transformers import speed
from twinkle_transformers.export import WeightExportMethods
from twinkle_transformers.loading import load_or_adopt, max_model_length
from twinkle_transformers.lora import lora_config, lora_config_json
from twinkle_transformers.multi_lora.data_parallel import MESH_ADVICE, DataRanks
from twinkle_transformers.multi_lora.manager import MultiLoraManager
from twinkle_transformers.multi_lora.mixed_pass import TenantWork, as_tenant_error
from twinkle_transformers.multi_lora.pass_planner import DEFAULT_MAX_PASS_TOKENS, STRATEGIES, PassPlanner
from twinkle_transformers.multi_lora.passes import forward_passes, lockstep_passes, run_lockstep, run_tenants
from twinkle_transformers.multi_lora.persistence import AdapterCheckpointMethods
from twinkle_transformers.multi_lora.tenant_batch import RowLimits, validate_rows
from twinkle_transformers.multi_lora.tenant_calls import PendingStep, step_outcome
from twinkle_transformers.vision import language_config


class MultiLoraTransformersModel(AdapterCheckpointMethods, TrainStateMethods, WeightExportMethods, Model):
    """Many LoRA tenants on one frozen Hugging Face causal LM; tenants may share one forward/backward.

    Args (as `TransformersModel`): `model_id` (local directory, ``ms://``/``hf://`` reference or HF id),
    `device` (default CUDA > MPS > CPU), `dtype` (default bfloat16 on GPUs, float32 on CPU),
    `attn_implementation`, `max_length` (default ``config.max_position_embeddings``), ``**from_pretrained_kwargs``.
    Or `model=`: an already loaded causal LM to host the adapters (it is frozen and moved to `device`).
    `pass_strategy`: how a multi-tenant call splits into forward/backward passes -- 'auto' (default: one mixed
    pass, groups of tenants or one by one, whichever measured fastest; see `PassPlanner`), 'mixed' or
    'one_by_one'. `max_pass_tokens`: the most (padded) tokens one pass may hold (None: no cap). `kernels`: layer
    kernels installed for training at load (as `TransformersModel`'s; `self.kernels` counts the replacements).
    `gradient_checkpointing`: True or a policy, as `TransformersModel`'s (recomputation in the mixed pass's
    backward sees the same per-token routing). `device_mesh`: several ranks (default the runtime's global mesh),
    the base replicated over ``dp_size`` and sharded by FSDP2 over ``fsdp_size``; each rank holds every adapter and
    trains on its own rows of each tenant, with the gradients, losses and metrics of one process over all of them
    (`data_parallel`).
    """

    #: many tenants mixed in one call; dp/fsdp ranks of ``device_mesh=``; ``pass_strategy=`` one of `STRATEGIES`
    capabilities = ModelCapabilities(
        mixed_adapters=True,
        max_adapters=None,
        takes_device=True,
        takes_device_mesh=True,
        mesh_dims=('dp', 'fsdp'),
        mesh_advice=MESH_ADVICE,
        pass_strategies=STRATEGIES,
        gradient_checkpointing=True,
    )

    def __init__(
        self,
        model_id: str | os.PathLike[str] | None = None,
        *,
        model: torch.nn.Module | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        attn_implementation: str | None = None,
        max_length: int | None = None,
        pass_strategy: str = 'auto',
        max_pass_tokens: int | None = DEFAULT_MAX_PASS_TOKENS,
        kernels: Sequence[Any] = (),
        gradient_checkpointing: Any = False,
        device_mesh: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        self.planner = PassPlanner(pass_strategy, max_pass_tokens=max_pass_tokens)  # checks its arguments first
        self.device_mesh = device_mesh if device_mesh is not None else global_device_mesh()
        check_mesh_support(type(self), self.device_mesh)  # before any weight loads
        if (model_id is None) == (model is None):
            raise InvalidInputError(
                'pass exactly one of model_id= (a path, hub reference or HF id) or model= (a loaded causal LM).'
            )
        self.device = torch.device(device) if device is not None else default_device()
        self.model, self.model_id, self.model_dir, self.tokenizer = load_or_adopt(
            model_id,
            model,
            device=self.device,
            dtype=dtype,
            attn_implementation=attn_implementation,
            **from_pretrained_kwargs,
        )
        self.kernels = apply_kernels(self.model, kernels, mode='training', device=self.device.type)
        self.checkpointed_layers = speed.checkpoint_decoder_layers(self.model, gradient_checkpointing)
        self.manager = MultiLoraManager.attach(self.model)
        self.data_ranks = DataRanks.of(self.device_mesh, self.model, self.manager)
        self.max_length, _ = max_model_length(self.model.config, max_length)
        self.limits = RowLimits(vocab_size=language_config(self.model.config).vocab_size, max_length=self.max_length)
        self.states: dict[str, TrainState] = {}
        self._current: list[str] = []
        self._pending: PendingStep | None = None
        notify_model_loaded(self.model, self.model_id)

    # ---- adapters ------------------------------------------------------------------------------------------
    def add_adapter_to_model(
        self,
        adapter_name: str,
        config: Any,
        *,
        gradient_accumulation_steps: int = 1,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
        """Add LoRA adapter `adapter_name` (a peft `LoraConfig` or dict of its fields; ``target_modules``
        defaults to ``'all-linear'``; kwargs override fields). Weights start like peft's (`generator`: seed them)."""
        self._add(
            adapter_name,
            lora_config(config, model=self.model, **kwargs),
            gradient_accumulation_steps,
            generator=generator,
        )

    def _add(self, name: str, config: Any, gradient_accumulation_steps: int, **weights: Any) -> None:
        state = TrainState(
            name, lambda: self.manager.parameters(name), gradient_accumulation_steps=gradient_accumulation_steps
        )
        self.manager.add_adapter(name, config, **weights)
        self.states[name] = state
        if self.data_ranks is not None and 'state_dict' not in weights:
            self.data_ranks.broadcast_adapter(name)

    @remote_method('all', 'first')
    def remove_adapter(self, adapter_name: str) -> None:
        """Delete the adapter's parameters, optimizer and scheduler state, metrics and settings."""
        self.manager.remove_adapter(adapter_name)
        state = self.states.pop(adapter_name)
        state.optimizer = state.lr_scheduler = None

    @remote_method('first', 'first', mutates=False)
    def list_adapters(self) -> list[str]:
        return self.manager.adapter_names

    @contextlib.contextmanager
    def adapter(self, adapter_name: str) -> Iterator[MultiLoraTransformersModel]:
        """Per-tenant calls inside the block default to ``adapter_name``."""
        self._state(adapter_name)
        self._current.append(adapter_name)
        try:
            yield self
        finally:
            self._current.pop()

    def _name(self, adapter_name: str | None) -> str:
        name = adapter_name if adapter_name is not None else (self._current[-1] if self._current else None)
        if name is None:
            raise InvalidInputError(
                f'adapter_name is required (or use `with model.adapter(name):`); adapters: '
                f'{self.list_adapters() or "none yet: add_adapter_to_model first"}.'
            )
        return name

    def _state(self, adapter_name: str | None) -> TrainState:
        name = self._name(adapter_name)
        try:
            return self.states[name]
        except KeyError:
            raise KeyError(
                f'no adapter named {name!r}; adapters: {self.list_adapters() or "none"}. Add it first '
                'with add_adapter_to_model (or load a checkpoint into it).'
            ) from None

    # ---- training step -------------------------------------------------------------------------------------
    @reports_failure('forward_backward')
    def forward_backward(
        self,
        *,
        inputs: Any,
        adapter_name: str | None = None,
        return_errors: bool = False,
        old_logps: Any = None,
        advantages: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Forward + loss + backward (gradients accumulate per adapter).

        `inputs`: rows of one adapter (with `adapter_name`), rows that each carry an ``adapter_name`` field, or
        ``{adapter_name: rows, ...}`` -- the latter two run all tenants in one pass and return per-tenant results.
        `old_logps` / `advantages`: per-row values folded into the rows (`twinkle_core.train.row_keywords`).
        Passes are sized by the planner (`max_pass_tokens`), so there is no `micro_batch_size` here.
        """
        loss = self._state(adapter_name).loss if adapter_name is not None else None
        inputs = with_row_keywords(inputs, old_logps=old_logps, advantages=advantages, loss=loss)
        return self._run(inputs, adapter_name, train=True, return_errors=return_errors, extra=kwargs)

    @reports_failure('forward_only')
    def forward_only(
        self,
        *,
        inputs: Any,
        adapter_name: str | None = None,
        return_errors: bool = False,
        compute_loss: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Forward without gradients: per-row logprobs (aligned with input_ids) and, unless
        ``compute_loss=False``, each tenant's loss where rows have labels. Same input forms as
        `forward_backward`. Use ``compute_loss=False`` for reference/behaviour logprobs while an RL loss is set."""
        self._eval_loss = None
        out = self._run(
            inputs, adapter_name, train=False, return_errors=return_errors, extra=kwargs, compute_loss=compute_loss
        )
        self._eval_loss = (
            out.get('loss')
            if 'logprobs' in out
            else {name: r['loss'] for name, r in out.items() if 'loss' in r} or None
        )
        return out

    def _run(
        self,
        inputs: Any,
        adapter_name: str | None,
        *,
        train: bool,
        return_errors: bool,
        extra: dict[str, Any],
        compute_loss: bool = True,
    ) -> dict[str, Any]:
        work, errors, mixed = self._prepare(
            inputs, adapter_name, train=train, extra=extra, method='forward_backward' if train else 'forward_only'
        )
        for w in work:
            w.compute_loss = compute_loss
        if self.data_ranks is None:
            run_tenants(self.model, self.manager, work, train=train, planner=self.planner, device=self.device)
        else:
            call = self.data_ranks.begin(work, errors, self.states, train)
            if self.data_ranks.sharded:
                run_lockstep(
                    lockstep_passes(self.model, self.manager, [*work, *call.absent], train=train, device=self.device)
                )
            else:
                run_tenants(self.model, self.manager, work, train=train, planner=self.planner, device=self.device)
            work = self.data_ranks.finish(call, work, errors)
        return step_outcome(work, errors, mixed, return_errors=return_errors)

    def _prepare(
        self, inputs: Any, adapter_name: str | None, *, train: bool, extra: dict[str, Any], method: str
    ) -> tuple[list[TenantWork], dict[str, TenantStepError], bool]:
        """Validated work per tenant, input errors per tenant, and whether the call is a mixed one."""
        accepted = (
            ('inputs', 'adapter_name')
            + (('return_errors',) if method != 'forward' else ())
            + (('compute_loss',) if method == 'forward_only' else ())
        )
        reject_unknown_kwargs(method, extra, accepted)
        batches, mixed = split_by_tenant(inputs, adapter_name, self._name, pinned=bool(self._current))
        work, errors = [], {}
        for name, batch in batches.items():
            if self.data_ranks is not None and isinstance(batch, (list, tuple)) and not batch:
                continue  # no rows of this tenant on this data rank: `DataRanks.begin` counts it as absent
            try:
                state = self._state(name)
                work.append(TenantWork(name, state, validate_rows(batch, self.limits)))
            except (InvalidInputError, KeyError) as exc:
                errors[name] = TenantStepError(name, 'input', exc.args[0] if exc.args else repr(exc))
        if self.model.training != train:
            self.model.train(train)
        return work, errors, mixed

    # ---- the same step in three calls (as TransformersModel): forward -> calculate_loss -> backward ----------
    @remote_method('slice_dp', 'list', mutates=False)
    @reports_failure('forward')
    def forward(self, *, inputs: Any, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Forward with gradients, kept for `calculate_loss` and `backward` (a new `forward` replaces a pending
        one). Same input forms as `forward_backward`; returns logprobs (per tenant when mixed)."""
        work, errors, mixed = self._prepare(inputs, adapter_name, train=True, extra=kwargs, method='forward')
        self._eval_loss = None
        call = self.data_ranks.begin(work, errors, self.states, True) if self.data_ranks is not None else None
        if call is not None and self.data_ranks is not None and self.data_ranks.sharded:
            passes = []
            for mixed_pass in lockstep_passes(
                self.model, self.manager, [*work, *call.absent], train=True, device=self.device
            ):
                try:  # no retry apart from the other ranks; `backward` rejects the pass's tenants on every rank
                    mixed_pass.forward()
                    passes.append(mixed_pass)
                except Exception as exc:
                    errors.update({w.name: as_tenant_error(w.name, exc) for w in mixed_pass.group})
        else:
            passes = forward_passes(self.model, self.manager, work, self.planner, self.device, errors)
        self._pending = PendingStep(work, errors, mixed, passes, call)
        try:
            return step_outcome(work, errors, mixed, return_errors=False)
        except Exception:
            if call is not None and self.data_ranks is not None:  # on several ranks no backward follows it
                self.data_ranks.abandon(call)  # (the earlier gradients back)
                self._pending = None
            raise

    @remote_method('all', 'mean', mutates=False)
    @reports_failure('calculate_loss')
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> float | dict[str, float]:
        """Loss of the pending `forward` (kept for `backward`): a float, or {adapter_name: float} when mixed. Right
        after a `forward_only` (no `forward` since), the losses that evaluation pass computed."""
        reject_unknown_kwargs('calculate_loss', kwargs, ('adapter_name',))
        eval_loss = self._loss_of_last_forward_only()
        if eval_loss is not None:
            return eval_loss
        pending = self._require_pending('calculate_loss')
        for mixed_pass in pending.passes:
            mixed_pass.losses()
        if self.data_ranks is None:
            out = step_outcome(pending.work, pending.errors, pending.mixed, return_errors=False)
            return {name: r['loss'] for name, r in out.items()} if pending.mixed else out['loss']
        losses = self.data_ranks.agree_losses(pending.rank_call, pending.work, pending.errors)  # every rank's rows
        out = step_outcome(pending.work, pending.errors, pending.mixed, return_errors=False)  # agreed errors raise
        return losses if pending.mixed else next(iter(losses.values()))

    @remote_method('all', 'mean')
    @reports_failure('backward')
    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Backpropagate the pending pass's healthy losses once (gradients accumulate per adapter). Returns
        ``{'loss', 'logprobs', 'metrics'}`` (per tenant when mixed); rejected tenants raise as in
        `forward_backward`."""
        reject_unknown_kwargs('backward', kwargs, ('adapter_name',))
        pending = self._require_pending('backward')
        self._pending = None
        for mixed_pass in pending.passes:
            try:
                mixed_pass.backward()
            except Exception as exc:
                pending.errors.update({w.name: as_tenant_error(w.name, exc) for w in mixed_pass.group})
        work = pending.work
        if self.data_ranks is not None:
            work = self.data_ranks.finish(pending.rank_call, work, pending.errors)
        return step_outcome(work, pending.errors, pending.mixed, return_errors=False)

    def model_info(self) -> dict[str, Any]:
        """``model_id``, ``max_length`` and ``pass_stats`` (how many passes of each plan the planner ran)."""
        return {'model_id': self.model_id, 'max_length': self.max_length, 'pass_stats': dict(self.planner.stats)}

    def get_train_configs(self, *, adapter_name: str | None = None) -> dict[str, Any]:
        name = self._name(adapter_name)
        record = self.manager.record(name)
        adapter = lora_config_json(record.config)
        return {
            'model_id': self.model_id,
            'adapter_name': name,
            'model_class': type(self.model).__name__,
            'device': str(self.device),
            'dtype': str(next(self.model.parameters()).dtype).removeprefix('torch.'),
            'max_length': self.max_length,
            'adapter': adapter,
            'adapted_modules': len(record.targets),
            'num_adapters': len(self.states),
            **self._state(name).describe(),
        }
