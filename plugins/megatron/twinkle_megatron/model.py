"""`MegatronModel`: a Hugging Face checkpoint trained through Megatron-Core, behind the twinkle `Model` interface.

`TransformersModel` -> `MegatronModel` is a one-word change: the same calls, losses, processors (padding and
padding-free), metrics, hooks and checkpoint formats. The mesh decides the split: ``tp_size`` (tensor
parallelism, plus ``sequence_parallel=True``), ``pp_size`` (1F1B pipeline; ``virtual_pipeline_stages`` for the
interleaved schedule), ``dp_size`` (Megatron DDP; the distributed optimizer, ZeRO-1, is on by default when
dp > 1). The pieces:

- `architecture` / `convert` / `build`: HF config -> Megatron config, HF <-> Megatron weights, the model chunks;
- `lora`: tensor-parallel LoRA in PEFT's terms; `optim`: Megatron's optimizer behind `TrainState`;
- `schedule`: one pass through Megatron's pipeline schedule with twinkle's losses;
- `persistence`: save / load / weight export (HF and PEFT format, gathered over tp and pp), a collaborator the
  model holds (`MegatronModel.persistence`) and delegates to.

    model = MegatronModel('ms://Qwen/Qwen3-0.6B', device_mesh=DeviceMesh.from_sizes(tp_size=2, dp_size=2))
    model.add_adapter_to_model('default', {'r': 8, 'lora_alpha': 32})
    model.set_optimizer('AdamW', lr=1e-4)
    model.forward_backward(inputs=batch)
    model.clip_grad_and_step()

Several named adapters train on one frozen base, each with its own optimizer, loss and processor
(`twinkle_megatron.adapters`, `twinkle_megatron.units`); a call names its adapter with ``adapter_name=`` (needed
once there are several), or passes ``inputs={adapter_name: rows, ...}`` to train several in one pipeline schedule
(`twinkle_megatron.mixed_step`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import torch

from twinkle_core.errors import TwinkleError
from twinkle_core.hooks.emit import notify_model_loaded
from twinkle_core.model.base import Model, ModelCapabilities, reject_unknown_kwargs
from twinkle_core.model.mesh_support import check_mesh_support
from twinkle_core.model.mixed_calls import call_outcome, split_by_tenant
from twinkle_core.runtime.context import global_device_mesh
from twinkle_core.train.activation_checkpointing import apply_activation_checkpointing
from twinkle_core.train.compile import compile_blocks
from twinkle_core.train.model_loading import default_device, load_tokenizer_if_any, resolve_dtype, resolve_model_dir
from twinkle_core.train.row_keywords import with_row_keywords
from twinkle_core.train.state import FULL
from twinkle_core.train.state_methods import TrainStateMethods, reports_failure
from twinkle_core.weight_sync.weights import Bucket
from twinkle_megatron import adapter_scope, build, cpu_compat, groups, mixed_step, schedule, step
from twinkle_megatron.adapters import AdapterMethods
from twinkle_megatron.architecture import Architecture, architecture_of, check_layout
from twinkle_megatron.persistence import MegatronPersistence
from twinkle_megatron.units import TrainingUnit


class MegatronModel(AdapterMethods, TrainStateMethods, Model):
    """A trainable causal LM on Megatron-Core (kind ``model``, name ``MegatronModel``).

    Args:
        model_id: local directory, ``ms://org/repo[@rev]``, ``hf://org/repo[@rev]`` or a Hugging Face id of a
            Qwen3 / Qwen2 / Llama / Qwen3-MoE checkpoint (safetensors).
        device / dtype: default CUDA (``cuda:$LOCAL_RANK``) in bfloat16, else CPU in float32.
        max_length: longest accepted row (default ``config.max_position_embeddings``).
        device_mesh: tp / pp / dp (and ep for MoE) sizes; default the one given to ``twinkle_core.initialize``.
        sequence_parallel: split the sequence over the tp ranks outside attention and MLP (needs tp > 1).
        virtual_pipeline_stages: model chunks per pipeline rank (interleaved 1F1B; needs pp > 1).
        distributed_optimizer: shard optimizer state over dp (default: when dp > 1).
        seed: Megatron's RNG seed (dropout, LoRA initialisation).
        compile_layers: ``torch.compile`` each transformer layer (True: inductor, or a backend name).
        gradient_checkpointing: True or a policy over the global layer indices (every k-th layer,
            ``'selective'``: attention only, chosen layers; `twinkle_core.train.activation_checkpointing`).
    """

    backend = 'megatron'
    #: several named adapters, mixed in one call; placed by ``device=``, parallel over ``device_mesh=``
    capabilities = ModelCapabilities(
        mixed_adapters=True,
        max_adapters=None,
        takes_device=True,
        takes_device_mesh=True,
        mesh_dims=('dp', 'tp', 'pp', 'ep'),
        mesh_advice=groups.MESH_ADVICE,
        gradient_checkpointing=True,
    )

    def __init__(
        self,
        model_id: str | os.PathLike[str],
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        max_length: int | None = None,
        device_mesh: Any = None,
        sequence_parallel: bool = False,
        virtual_pipeline_stages: int = 1,
        distributed_optimizer: bool | None = None,
        seed: int = 42,
        compile_layers: bool | str = False,
        gradient_checkpointing: Any = False,
    ) -> None:
        from transformers import AutoConfig

        cpu_compat.apply()
        self.model_id = str(model_id)
        self.model_dir = resolve_model_dir(model_id)
        self.arch = self._architecture(AutoConfig.from_pretrained(self.model_dir))
        self.device_mesh = device_mesh if device_mesh is not None else global_device_mesh()
        check_mesh_support(type(self), self.device_mesh)
        self.layout = groups.layout_of(
            self.device_mesh, sequence_parallel=sequence_parallel, virtual_pipeline=virtual_pipeline_stages
        )
        check_layout(self.arch, self.layout)
        groups.initialize(self.device_mesh, self.layout, seed=seed)
        self.seed = seed
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = resolve_dtype(dtype, self.device)
        self.ranks = groups.ranks()
        self.chunks: list[Any] = build.build_chunks(self.arch, self.layout, self.dtype, self.device)
        build.load_hf_weights(
            self.chunks,
            self.arch,
            self._weights_reader(),
            tp=self.layout.tp,
            tp_rank=self.ranks['tp'],
            expert_offset=self.expert_offset(),
        )
        indices, layers = zip(*build.decoder_layers(self.chunks))  # regional compilation, activation checkpointing
        self.compile_backend = compile_blocks(layers, compile_layers)
        self.checkpointed_layers = apply_activation_checkpointing(
            layers,
            gradient_checkpointing,
            indices=indices,
            num_layers=self.arch.num_layers,
            recompute_context=adapter_scope.recompute_routing,
        )
        self.distributed_optimizer = self.layout.dp > 1 if distributed_optimizer is None else distributed_optimizer
        self.tokenizer = load_tokenizer_if_any(self.model_dir)
        self.max_length = int(max_length or self.arch.max_position_embeddings)
        self.pad_token_id = getattr(self.tokenizer, 'pad_token_id', None) or 0
        self._pending = None
        self.units: dict[str, TrainingUnit] = {FULL: self._new_unit(FULL)}
        self.persistence = MegatronPersistence(self)  # checkpoints and weight export (delegated below)
        notify_model_loaded(self.chunks[0], self.model_id)

    def _architecture(self, config: Any) -> Architecture:
        """The Megatron architecture of the checkpoint's HF config (a value model's: with its scalar head)."""
        return architecture_of(config)

    def _weights_reader(self) -> Callable[[str], torch.Tensor]:
        """Where the base weights are read from: the checkpoint (a value model also supplies a new head)."""
        return build.HFTensorReader(self.model_dir)

    @property
    def row_outputs(self) -> schedule.RowOutputs:
        """What the output layer gives the loss and the caller: per-token log-probs, or a value head's values."""
        return schedule.ScalarValues() if self.arch.value_head else schedule.TokenLogprobs(self.arch.vocab_size)

    def expert_offset(self) -> int:
        """The global index of this rank's first local expert (0 for a dense model)."""
        if not self.arch.is_moe:
            return 0
        return self.ranks['ep'] * (self.arch.num_experts // self.layout.ep)

    # ---- training step ---------------------------------------------------------------------------------------
    @reports_failure('forward_backward')
    def forward_backward(
        self,
        *,
        inputs: Any,
        adapter_name: str | None = None,
        return_errors: bool = False,
        old_logps: Any = None,
        advantages: Any = None,
        micro_batch_size: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Forward, loss and backward through the pipeline schedule. Returns ``{'loss', 'logprobs', 'metrics'}``.
        `micro_batch_size`: rows per pipeline micro-batch (default: the rows split into pp micro-batches); the
        gradients equal one pass over all rows. `inputs` may be ``{adapter_name: rows}`` (or rows that each carry
        an ``adapter_name``): every adapter's rows in one schedule, per-adapter results (`mixed_step`; failed
        adapters raised together as `MixedStepError`, or returned inline as ``{'error': ...}`` with
        `return_errors`)."""
        reject_unknown_kwargs(
            'forward_backward',
            kwargs,
            ('inputs', 'adapter_name', 'return_errors', 'old_logps', 'advantages', 'micro_batch_size'),
        )
        several = adapter_name is None and len(self.units) > 1  # a mixed call: keywords go into each one's rows
        loss = None if several else self.unit_for(adapter_name).state.loss
        inputs = with_row_keywords(inputs, old_logps=old_logps, advantages=advantages, loss=loss)
        self._eval_loss = None
        mixed = self._mixed(inputs, adapter_name, return_errors, micro_batch_size, training=True, compute_loss=True)
        if mixed is not None:
            return mixed
        unit = self.unit_for(adapter_name)
        result = step.run(self, unit, inputs, micro_batch_size, training=True, compute_loss=True)
        unit.last_loss = result.get('loss')
        return result

    @reports_failure('forward_only')
    def forward_only(
        self,
        *,
        inputs: Any,
        adapter_name: str | None = None,
        return_errors: bool = False,
        compute_loss: bool = True,
        micro_batch_size: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Forward without gradients: per-row logprobs, plus the loss when rows have labels and `compute_loss`.
        Takes the inputs `forward_backward` takes."""
        reject_unknown_kwargs(
            'forward_only', kwargs, ('inputs', 'adapter_name', 'return_errors', 'compute_loss', 'micro_batch_size')
        )
        self._eval_loss = None
        with torch.no_grad():
            mixed = self._mixed(
                inputs, adapter_name, return_errors, micro_batch_size, training=False, compute_loss=compute_loss
            )
            if mixed is not None:
                return mixed
            result = step.run(
                self, self.unit_for(adapter_name), inputs, micro_batch_size, training=False, compute_loss=compute_loss
            )
        self._eval_loss = result.get('loss')
        return result

    def _mixed(
        self, inputs: Any, adapter_name: str | None, return_errors: bool, micro_batch_size: int | None, **run: bool
    ) -> dict[str, Any] | None:
        """The per-adapter results of a call over several adapters' rows (None: a call of one adapter)."""
        tenants, mixed = split_by_tenant(inputs, adapter_name, lambda name: name or FULL)
        if not mixed:
            return None
        names, results, errors = mixed_step.run_mixed(self, tenants, micro_batch_size=micro_batch_size, **run)
        return call_outcome(names, results, errors, True, return_errors=return_errors)

    @reports_failure('calculate_loss')
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> float:
        """The loss of the last `forward_only` (evaluation) or, failing that, of the last `forward_backward`."""
        reject_unknown_kwargs('calculate_loss', kwargs, ('adapter_name',))
        loss = self._loss_of_last_forward_only()
        loss = self.unit_for(adapter_name).last_loss if loss is None else loss
        if loss is None:
            raise TwinkleError(
                'calculate_loss() needs a preceding forward_backward or forward_only with labels '
                '(MegatronModel runs forward, loss and backward as one pipeline schedule).'
            )
        return loss

    def forward(self, **kwargs: Any) -> Any:
        raise TwinkleError(
            'MegatronModel runs forward, loss and backward as one pipeline schedule: call '
            'forward_backward(inputs=...) (or forward_only for no gradients).'
        )

    backward = forward

    # ---- checkpoints and weight export (delegated to `self.persistence`) ----------------------------------------
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
        **kwargs: Any,
    ) -> str:
        """Write checkpoint `name` under `output_dir` (default ``./output``); returns its directory
        (`MegatronPersistence.save`)."""
        return self.persistence.save(
            name,
            output_dir=output_dir,
            save_optimizer=save_optimizer,
            adapter_name=adapter_name,
            dataloader=dataloader,
            extra_state=extra_state,
            **kwargs,
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
        """Load a checkpoint, a PEFT adapter directory or a Hugging Face model directory
        (`MegatronPersistence.load`)."""
        return self.persistence.load(
            path, load_optimizer=load_optimizer, adapter_name=adapter_name, dataloader=dataloader, **kwargs
        )

    def trains_base(self) -> bool:
        return self.persistence.trains_base()

    def is_export_rank(self) -> bool:
        return self.persistence.is_export_rank()

    def weight_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return self.persistence.weight_layout()

    def export_base(self, *, bucket_bytes: int = 256 << 20) -> Iterator[Bucket]:
        return self.persistence.export_base(bucket_bytes=bucket_bytes)

    def export_adapter(self, name: str, *, bucket_bytes: int = 256 << 20) -> tuple[dict[str, Any], Iterator[Bucket]]:
        return self.persistence.export_adapter(name, bucket_bytes=bucket_bytes)

    def shutdown(self) -> None:
        """Release Megatron's process groups in this process (`groups.shutdown`); the model is unusable after."""
        self.chunks.clear()
        self.units.clear()
        groups.shutdown()

    def model_info(self) -> dict[str, Any]:
        return {
            'model_id': self.model_id,
            'max_length': self.max_length,
            'backend': self.backend,
            'layout': self.layout_json(),
        }

    def get_train_configs(self, *, adapter_name: str | None = None) -> dict[str, Any]:
        unit = self.unit_for(adapter_name)
        state = unit.state
        adapter = None if unit.adapter is None else self.persistence.adapter_config_json(unit.adapter)
        return {
            'model_id': self.model_id,
            'backend': self.backend,
            'architecture': self.arch.model_type,
            'device': str(self.device),
            'dtype': str(self.dtype).removeprefix('torch.'),
            'max_length': self.max_length,
            'layout': self.layout_json(),
            'distributed_optimizer': self.distributed_optimizer,
            'cpu_bridges': cpu_compat.applied(),
            'adapter': adapter,
            **state.describe(),
        }

    def layout_json(self) -> dict[str, Any]:
        """The parallel layout (tp, pp, dp, vpp, sp, ep) as checkpoint metadata records it."""
        lay = self.layout
        return {'tp': lay.tp, 'pp': lay.pp, 'dp': lay.dp, 'vpp': lay.vpp, 'sp': lay.sp, 'ep': lay.ep}
