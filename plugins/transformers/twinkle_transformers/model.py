"""`TransformersModel`: a Hugging Face causal LM trained through the twinkle `Model` interface.

Full-parameter training, or one LoRA adapter (`add_adapter_to_model`); several adapters at once are
`MultiLoraTransformersModel`'s job. A thin composition: `loading` (model id -> HF model on its device and dtype),
`TrainState` held by one `SingleUnit` (optimizer, scheduler, loss, processor, template, accumulation, metrics),
`TrainStateMethods` (the `set_*` and optimizer-step methods forwarding to it), `forward` (collated batch ->
log-probs -> loss) and `checkpoint` (PEFT / HF files + resumable training state).

    model = TransformersModel(model_id='ms://Qwen/Qwen3-0.6B')
    model.add_adapter_to_model('default', {'r': 8, 'lora_alpha': 32, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=1e-4)
    for batch in loader:
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step(max_norm=1.0)
    model.save('final', output_dir='out')
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import Any, Sequence

import torch

from twinkle_core.dispatch import remote_method
from twinkle_core.errors import TwinkleError
from twinkle_core.hooks.emit import notify_model_loaded
from twinkle_core.kernel import apply_kernels
from twinkle_core.model.base import Model, ModelCapabilities, reject_unknown_kwargs
from twinkle_core.model.mesh_support import check_mesh_support
from twinkle_core.runtime.context import global_device_mesh
from twinkle_core.train.loss_step import micro_batch_shares, rows_logprobs, run_loss, step_summary
from twinkle_core.train.model_loading import default_device, load_tokenizer_if_any, resolve_dtype, resolve_model_dir
from twinkle_core.train.row_keywords import check_row_lengths, micro_batches, with_row_keywords
from twinkle_core.train.single_unit import SingleUnit
from twinkle_core.train.state import FULL, TrainState
from twinkle_core.train.state_methods import TrainStateMethods, reports_failure
from twinkle_core.types import as_input_features
from twinkle_transformers import parallel, persistence, speed, vision
from twinkle_transformers.export import WeightExportMethods
from twinkle_transformers.forward import forward_logps
from twinkle_transformers.loading import load_causal_lm, max_model_length
from twinkle_transformers.lora import lora_config, lora_config_json

logger = logging.getLogger(__name__)


class TransformersModel(TrainStateMethods, WeightExportMethods, Model):
    """A trainable Hugging Face causal LM (kind ``model``, name ``TransformersModel``).

    Args:
        model_id: local directory, ``ms://org/repo[@rev]``, ``hf://org/repo[@rev]`` or a Hugging Face id.
        device: default CUDA > MPS > CPU. dtype: default bfloat16 on GPUs, float32 on CPU.
        attn_implementation: passed to ``from_pretrained``; default ``twinkle_sdpa`` (PyTorch SDPA that attends
            per sequence in padding-free batches, `twinkle_transformers.attention`) where the model supports SDPA.
        max_length: longest accepted row (default ``config.max_position_embeddings``).
        device_mesh: how ranks train together (DDP / FSDP2 / TP / Ulysses sequence parallelism over ``cp_size``
            (alias ``sp_size``) / MoE expert parallelism over ``ep_size``, see `twinkle_transformers.parallel`); default
            the one given to ``twinkle_core.initialize``. Applied once, at `set_optimizer` or the first forward.
        kernels: layer kernels installed at load for training, by name (``'RMSNorm'``), hub reference
            (``'hf://org/repo@rev:Layer'``) or `Kernel` (`twinkle_core.kernel.apply_kernels`); `self.kernels`
            says how many modules each replaced.
        freeze_vision_tower: vision-language models only: full fine-tuning leaves the vision encoder as loaded
            (LoRA never adapts it unless ``target_modules`` asks for ``'vision'`` or ``'all'``).
        compile_layers: ``torch.compile`` each decoder layer (True: inductor, or a backend name;
            `twinkle_transformers.speed`). gradient_checkpointing: True or a policy (every k-th layer,
            ``'selective'``, chosen layers: `twinkle_core.train.activation_checkpointing`).
        mixed_precision: ``'bf16'``: float32 parameters (master weights) and bf16 autocast forwards; dtype
            defaults to float32 then.
        **from_pretrained_kwargs: anything else ``AutoModelForCausalLM.from_pretrained`` takes (vision-language
            checkpoints, e.g. Qwen3-VL or Qwen3.5, load through ``AutoModelForImageTextToText``).
    """

    #: one trainable unit (the base or one adapter); placed by ``device=``, parallel over ``device_mesh=``
    capabilities = ModelCapabilities(
        mixed_adapters=False,
        max_adapters=1,
        takes_device=True,
        takes_device_mesh=True,
        mesh_dims=('dp', 'fsdp', 'tp', 'cp', 'ep'),
        mesh_advice=parallel.MESH_ADVICE,
        gradient_checkpointing=True,
    )
    # checkpoint -> module, and collated batch -> the loss's ``outputs``; `TransformersValueModel` swaps both
    _load_model, _forward_outputs = staticmethod(load_causal_lm), staticmethod(forward_logps)

    def __init__(
        self,
        model_id: str | os.PathLike[str],
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        attn_implementation: str | None = None,
        max_length: int | None = None,
        device_mesh: Any = None,
        kernels: Sequence[Any] = (),
        freeze_vision_tower: bool = False,
        compile_layers: bool | str = False,
        gradient_checkpointing: Any = False,
        mixed_precision: str | None = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        self.model_id = str(model_id)
        self.device_mesh = device_mesh if device_mesh is not None else global_device_mesh()
        check_mesh_support(type(self), self.device_mesh)  # before any weight loads
        if self.device_mesh is not None:
            parallel.check_layout(self.device_mesh)
        self._mesh_applied = False
        self.model_dir = resolve_model_dir(model_id)
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = resolve_dtype('float32' if dtype is None and mixed_precision else dtype, self.device)
        self.autocast_dtype = speed.autocast_dtype(mixed_precision, self.dtype)
        self.attn_implementation = attn_implementation
        self.model: torch.nn.Module = self._load_model(
            self.model_dir,
            device=self.device,
            dtype=self.dtype,
            attn_implementation=attn_implementation,
            **from_pretrained_kwargs,
        )
        parallel.check_model(self.model, self.device_mesh)
        self.kernels = apply_kernels(self.model, kernels, mode='training', device=self.device.type)
        if freeze_vision_tower:
            vision.freeze_vision_tower(self.model)
        self.compile_backend = speed.compile_decoder_layers(self.model, compile_layers)
        self.checkpointed_layers = speed.checkpoint_decoder_layers(self.model, gradient_checkpointing)
        self.tokenizer = load_tokenizer_if_any(self.model_dir)
        self.max_length, self._max_length_source = max_model_length(self.model.config, max_length)
        self.unit = SingleUnit(TrainState(FULL, self.model.parameters))  # all parameters, until add_adapter_to_model
        self._pending: dict[str, Any] | None = None
        notify_model_loaded(self.model, self.model_id)

    # ---- configuration ---------------------------------------------------------------------------------------
    def add_adapter_to_model(
        self, adapter_name: str, config: Any, *, gradient_accumulation_steps: int = 1, **kwargs: Any
    ) -> None:
        """Freeze the base model and add the trainable LoRA adapter `adapter_name` (`config`: a
        ``peft.LoraConfig`` or a dict of its fields; ``target_modules`` defaults to ``'all-linear'``).
        Components set before (optimizer, loss, ...) are reset: set them after adding the adapter."""
        from peft import get_peft_model

        if parallel.applied_mesh(self.model) is not None:
            raise TwinkleError(
                f'add_adapter_to_model must come before set_optimizer and the first forward: the '
                f'model is already parallelised over {self.device_mesh!r}.'
            )
        if self.adapter_name is not None:
            raise TwinkleError(
                f'This model already trains adapter {self.adapter_name!r}; TransformersModel trains '
                f'one adapter. Use MultiLoraTransformersModel to train several at once.'
            )
        if self.state.optimizer is not None:
            logger.warning('add_adapter_to_model drops the optimizer set before it; call set_optimizer again.')
        self.model = get_peft_model(
            self.model, lora_config(config, model=self.model, **kwargs), adapter_name=adapter_name
        )
        self.unit = SingleUnit(
            TrainState(adapter_name, self.model.parameters, gradient_accumulation_steps=gradient_accumulation_steps),
            adapter_name,
        )

    # ---- the one trainable unit (`SingleUnit`): what `TrainStateMethods` asks for --------------------------------
    @property
    def adapter_name(self) -> str | None:
        """The LoRA adapter trained (None: all parameters)."""
        return self.unit.adapter_name

    @property
    def state(self) -> TrainState:
        return self.unit.state

    def list_adapters(self) -> list[str]:
        return self.unit.adapters()

    def _name(self, adapter_name: str | None) -> str | None:
        return self.unit.name(adapter_name)

    def _state(self, adapter_name: str | None) -> TrainState:
        return self.unit.state_for(adapter_name)

    def train_state(self, adapter_name: str | None) -> TrainState:
        """The training state (optimizer, scheduler, counters) of `adapter_name` (None: the model's only one);
        what a checkpoint saves and restores. Raises InvalidInputError for an unknown adapter."""
        return self._state(adapter_name)

    def set_optimizer(
        self, optimizer: Any = None, *, optimizer_cls: Any = None, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        self.apply_device_mesh()  # the optimizer must see the final (possibly sharded) parameters
        super().set_optimizer(optimizer, optimizer_cls=optimizer_cls, adapter_name=adapter_name, **kwargs)

    def apply_device_mesh(self) -> None:
        """Parallelise the model over `device_mesh` once its trainable parameters are final (idempotent; no-op
        without a mesh). Called before an optimizer is built over the parameters, and by checkpoint loading."""
        if not self._mesh_applied:
            self._mesh_applied = True
            parallel.apply_device_mesh(self.model, self.device_mesh)

    # ---- training step ---------------------------------------------------------------------------------------
    @remote_method('slice_dp', 'concat')
    @reports_failure('forward')
    def forward(self, *, inputs: Any, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Forward with gradients; the result is kept for `calculate_loss` and `backward`. Returns logprobs."""
        reject_unknown_kwargs('forward', kwargs, ('inputs', 'adapter_name'))
        state = self._state(adapter_name)
        self.apply_device_mesh()
        return self._row_outputs(batch := self._collate(state, inputs), self._forward_batch(state, batch))

    def _row_outputs(self, batch: dict[str, Any], outputs: dict[str, Any]) -> dict[str, list[Any]]:
        return {'logprobs': rows_logprobs(batch, outputs['target_logps'])}  # aligned with each row's input_ids

    def _forward_batch(self, state: TrainState, batch: dict[str, Any], share: float = 1.0) -> dict[str, Any]:
        """Forward a collated batch with gradients, pending its loss; `share`: this micro-batch's part of the
        call's loss (its gradient is scaled by it)."""
        self._eval_loss = None
        self.model.train()
        with speed.autocast(self.device, self.autocast_dtype):
            outputs = self._forward_outputs(self.model, batch, loss=state.loss)
        self._pending = {'state': state, 'batch': batch, 'outputs': outputs, 'loss': None, 'share': share}
        return outputs

    @remote_method('all', 'mean')
    @reports_failure('calculate_loss')
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> float:
        """Loss of the last `forward` (kept for `backward`); returns its value. Right after a `forward_only` (no
        `forward` since), the loss that evaluation pass computed (already in the evaluation metrics)."""
        reject_unknown_kwargs('calculate_loss', kwargs, ('adapter_name',))
        eval_loss = self._loss_of_last_forward_only()
        if eval_loss is not None:
            return eval_loss
        pending = self._require_pending('calculate_loss')
        pending['loss'] = run_loss(pending['state'].loss, pending['batch'], pending['outputs'])
        return float(pending['loss']['loss'].detach())

    @remote_method('all', 'mean')
    @reports_failure('backward')
    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Backpropagate the loss of the last `forward` (scaled for gradient accumulation); gradients add up."""
        reject_unknown_kwargs('backward', kwargs, ('adapter_name',))
        pending = self._require_pending('backward')
        if pending['loss'] is None:  # not through calculate_loss: its float() would sync the host here
            pending['loss'] = run_loss(pending['state'].loss, pending['batch'], pending['outputs'])
        state, result = pending['state'], pending['loss']
        reduction, rows = getattr(state.loss, 'reduction', None), len(pending['batch']['row_lengths'])
        summarise = partial(step_summary, pending['batch'], pending['outputs'], result['loss'])
        # Without a mesh the summary (a host sync) is fetched after the backward is queued; a mesh needs its counts
        summary = summarise() if parallel.applied_mesh(self.model) is not None else None
        dp_scale = parallel.backward_scale(
            self.model, reduction, num_loss_tokens=summary['num_loss_tokens'] if summary else 0, num_rows=rows
        )  # equal to one process over the global batch
        (result['loss'] * (state.loss_scale() * dp_scale * pending['share'])).backward()
        summary = parallel.reduce_step_summary(self.model, summary or summarise(), reduction, num_rows=rows)
        state.record(summary, is_training=True)
        self._pending = None
        return {'loss': summary['loss'], 'metrics': dict(result.get('metrics') or {})}

    @reports_failure('forward_backward')
    def forward_backward(
        self,
        *,
        inputs: Any,
        adapter_name: str | None = None,
        old_logps: Any = None,
        advantages: Any = None,
        micro_batch_size: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Forward, loss, backward. Returns ``{'loss', 'logprobs', 'metrics'}`` (docs/conventions.md).
        `old_logps` / `advantages`: per-row values folded into the rows; `micro_batch_size`: rows per pass, the
        gradients and loss equal one pass over all rows (`twinkle_core.train.row_keywords`)."""
        reject_unknown_kwargs(
            'forward_backward', kwargs, ('inputs', 'adapter_name', 'old_logps', 'advantages', 'micro_batch_size')
        )
        inputs = with_row_keywords(
            inputs, old_logps=old_logps, advantages=advantages, loss=self._state(adapter_name).loss
        )
        state = self._state(adapter_name)
        self.apply_device_mesh()
        if micro_batch_size is None:
            batch = self._collate(state, inputs)
            outputs = self._forward_batch(state, batch)
            result = self.backward()  # queued before the log-probs are fetched: no host sync mid-step
            return {**result, **self._row_outputs(batch, outputs)}
        chunks = micro_batches(as_input_features(inputs), micro_batch_size)
        batches = [self._collate(state, chunk) for chunk in chunks]
        shares, _ = micro_batch_shares(getattr(state.loss, 'reduction', None), batches)
        rows: dict[str, list[Any]] = {}
        loss = 0.0
        metrics: dict[str, float] = {}
        for batch, share in zip(batches, shares):
            outputs = self._forward_batch(state, batch, share)
            out = self.backward()
            for key, values in self._row_outputs(batch, outputs).items():
                rows.setdefault(key, []).extend(values)
            loss += share * out['loss']
            for name, value in out['metrics'].items():  # averaged over the micro-batches by their share
                if isinstance(value, (int, float)):
                    metrics[name] = metrics.get(name, 0.0) + value * share / sum(shares)
        return {'loss': loss, 'metrics': metrics, **rows}

    @reports_failure('forward_only')
    def forward_only(
        self, *, inputs: Any, adapter_name: str | None = None, compute_loss: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward in eval mode without gradients: per-row logprobs, plus the loss when rows have labels and
        `compute_loss` (pass False for behaviour/reference logprobs while an RL loss is set)."""
        reject_unknown_kwargs('forward_only', kwargs, ('inputs', 'adapter_name', 'compute_loss'))
        self._eval_loss = None
        state = self._state(adapter_name)
        self.apply_device_mesh()
        batch = self._collate(state, inputs)
        self.model.eval()
        with torch.no_grad(), speed.autocast(self.device, self.autocast_dtype):
            outputs = self._forward_outputs(self.model, batch, loss=state.loss)
            result: dict[str, Any] = self._row_outputs(batch, outputs)
            if compute_loss and bool(outputs['mask'].any()):
                loss_out = run_loss(state.loss, batch, outputs)
                summary = parallel.reduce_step_summary(
                    self.model,
                    step_summary(batch, outputs, loss_out['loss']),
                    getattr(state.loss, 'reduction', None),
                    num_rows=len(batch['row_lengths']),
                )
                state.record(summary, is_training=False)
                result.update(loss=summary['loss'], metrics=dict(loss_out.get('metrics') or {}))
        self._eval_loss = result.get('loss')
        return result

    def model_info(self) -> dict[str, Any]:
        return {'model_id': self.model_id, 'max_length': self.max_length}

    def get_train_configs(self, *, adapter_name: str | None = None) -> dict[str, Any]:
        state = self._state(adapter_name)
        model: Any = self.model  # an HF model (or a PeftModel around one): `config`, `peft_config` are no submodules
        adapter = None
        if self.adapter_name is not None:
            adapter = lora_config_json(model.peft_config[self.adapter_name])
        return {
            'model_id': self.model_id,
            'model_class': type(self.model).__name__,
            'device': str(self.device),
            'dtype': str(self.dtype).removeprefix('torch.'),
            'max_length': self.max_length,
            'kernels': self.kernels,
            'attn_implementation': model.config._attn_implementation,
            'adapter': adapter,
            **state.describe(),
        }

    def _collate(self, state: TrainState, inputs: Any) -> dict[str, Any]:
        rows = as_input_features(inputs)
        check_row_lengths(rows, self.max_length, self._max_length_source)
        return state.processor(rows, device=self.device)

    # ---- checkpoints -----------------------------------------------------------------------------------------
    @reports_failure('save')
    def save(
        self,
        name: str,
        *,
        output_dir: str | None = None,
        save_optimizer: bool = False,
        adapter_name: str | None = None,
        dataloader: Any = None,
        extra_state: Any = None,
        sharded: bool = False,
        **kwargs: Any,
    ) -> str:
        """Write checkpoint `name` under `output_dir` (default ``./output``); returns its directory.

        LoRA in PEFT format, full weights in HF format. ``save_optimizer=True`` adds the optimizer, scheduler,
        RNG states, step counters, ``dataloader.state_dict()`` and `extra_state` for an exact resume.
        ``sharded=True`` (for models that do not fit one process; FSDP2/TP shards): every rank writes its shards with
        ``torch.distributed.checkpoint``, nothing is gathered (`twinkle_transformers.sharded_checkpoint`;
        ``export_checkpoint`` makes a PEFT / HF directory of it).
        """
        return persistence.save(
            self, name, output_dir, save_optimizer, adapter_name, dataloader, extra_state, sharded=sharded
        )

    @reports_failure('load')
    def load(
        self,
        path: str,
        *,
        load_optimizer: bool = False,
        adapter_name: str | None = None,
        dataloader: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Load a checkpoint written by `save` (or a PEFT adapter / HF model directory).

        A LoRA checkpoint into a model without adapter first adds the adapter from the saved config.
        ``load_optimizer=True`` restores optimizer, scheduler, counters and RNG states (the optimizer is rebuilt
        from its saved name when it is not set yet) and ``dataloader.load_state_dict``; returns the saved
        ``extra_state`` (None otherwise).
        """
        return persistence.load(self, path, load_optimizer, adapter_name, dataloader)
