"""The Model interface: what a training script calls. Backends (Transformers, Megatron) implement it.

Every per-tenant method takes ``adapter_name=None``: a single-adapter model ignores it (or uses its only
adapter); a multi-adapter model requires it (or takes it from ``with model.adapter(name):``).

Gradient accumulation: `forward_backward` accumulates gradients; `clip_grad_and_step` performs the optimizer
step only on every `gradient_accumulation_steps`-th call (per adapter) and always returns the step's metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator

from twinkle_core.dispatch import remote_method
from twinkle_core.runtime.context import HostedComponentMeta


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model backend can do, declared (engines and the server plan with it instead of guessing from class
    names or constructor signatures). Every default describes the conservative case: a backend that declares
    nothing is driven one adapter at a time, on one rank, and is built with ``model_id`` only.

    Declare it as a class attribute (``capabilities = ModelCapabilities(...)``): the construction fields
    (`takes_device`, `takes_device_mesh`, `pass_strategies`) are read from the class before any instance exists.

    Training:

    - `mixed_adapters`: `forward_backward` / `forward_only` take ``inputs={adapter: rows}`` and
      ``return_errors=True``: one call trains several adapters and returns ``{adapter: result}``, a rejected
      adapter's result being ``{'error': {...}}`` (others are unaffected). Without it an engine calls once per
      adapter with ``adapter_name=``.
    - `max_adapters`: trainable adapters at once (None: bounded by memory only). 1 (the default) is a
      single-tenant backend: a server hosting it refuses a second training model with a 403 naming the limit.

    Construction (what a host may pass besides ``model_id``):

    - `takes_device`: the constructor accepts ``device=`` (``'cpu'``, ``'cuda:1'``, ...; None: its own default).
    - `takes_device_mesh`: the constructor accepts ``device_mesh=`` (a `DeviceMesh`) and trains across its ranks
      (data / tensor / pipeline parallel); without it the backend trains on one rank.
    - `pass_strategies`: the values the constructor accepts as ``pass_strategy=`` (how queued work of several
      adapters splits into forward/backward passes); empty: it takes no ``pass_strategy``.
    - `mesh_dims`: the mesh dimensions (``dp``, ``fsdp``, ``tp``, ``pp``, ``cp``, ``ep``) it implements (default:
      data parallel only); a mesh of more than one rank along any other is refused
      (`twinkle_core.model.mesh_support`), never ignored.
      `mesh_advice`: ``(dim, what to use instead)`` pairs for the error.
    - `gradient_checkpointing`: the constructor accepts ``gradient_checkpointing=`` (True or a policy,
      `twinkle_core.train.activation_checkpointing`).

    What its forward gives:

    - `outputs`: ``'logprobs'`` (a causal LM: per-row ``logprobs``; what a policy, the service and the samplers'
      weight sync need) or ``'values'`` (a scalar head: per-row ``values`` and ``scores``, a PPO critic or a
      reward model; the service refuses it as a training backend)."""

    mixed_adapters: bool = False
    max_adapters: int | None = 1
    takes_device: bool = False
    takes_device_mesh: bool = False
    pass_strategies: tuple[str, ...] = ()
    mesh_dims: tuple[str, ...] = ('dp',)
    mesh_advice: tuple[tuple[str, str], ...] = ()
    gradient_checkpointing: bool = False
    outputs: str = 'logprobs'


class Model(ABC, metaclass=HostedComponentMeta):
    """A trainable model. Inputs are lists of `InputFeature` rows (dicts or models)."""

    capabilities: ModelCapabilities = ModelCapabilities()

    # ---- configuration -------------------------------------------------------------------------------------
    @remote_method('all', 'first')
    @abstractmethod
    def add_adapter_to_model(
        self, adapter_name: str, config: Any, *, gradient_accumulation_steps: int = 1, **kwargs: Any
    ) -> None:
        """Add a trainable LoRA adapter (`config`: a `peft.LoraConfig` or a dict of its fields)."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_optimizer(
        self, optimizer: Any = None, *, optimizer_cls: Any = None, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """Optimizer by name (kind `optimizer`, e.g. 'AdamW') or class -- positionally or as ``optimizer_cls=``
        (Twinkle's spelling; see `component_arg`); kwargs go to its constructor."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_lr_scheduler(
        self, scheduler: Any = None, *, scheduler_cls: Any = None, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """LR scheduler by name (kind `lr_scheduler`) or class -- positionally or as ``scheduler_cls=``; requires an
        optimizer."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_loss(self, loss: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Loss by name (kind `loss`), class, instance or plain function. Unknown names raise."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_processor(self, processor: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Input processor (collation: padding or padding-free packing) by name, class or instance."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_template(self, template: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Chat template by name, class or instance (used by `encode`-side helpers and samplers)."""

    # ---- training step -------------------------------------------------------------------------------------
    @remote_method('slice_dp', 'mean')
    @abstractmethod
    def forward_backward(self, *, inputs: Any, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Forward, loss, backward (gradients accumulate). Returns {'loss': float, 'logprobs': [...], ...}."""

    @remote_method('slice_dp', 'concat', mutates=False)
    @abstractmethod
    def forward_only(
        self, *, inputs: Any, adapter_name: str | None = None, compute_loss: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward without gradients. Returns per-row target-token logprobs, and the loss when labels exist and
        `compute_loss` is true (False: logprobs only, e.g. old/reference logprobs while an RL loss is set)."""

    @remote_method('all', 'first')
    def update_optimizer(self, *, adapter_name: str | None = None, **fields: Any) -> None:
        """Set optimizer hyper-parameters (e.g. ``lr=``, ``betas=``, ``weight_decay=``) on every param group of the
        adapter's optimizer, keeping its state. Unknown fields raise InvalidInputError."""
        raise NotImplementedError(f'{type(self).__name__} does not support update_optimizer.')

    @remote_method('all', 'first')
    def remove_adapter(self, adapter_name: str) -> None:
        """Delete adapter `adapter_name`: its parameters, optimizer, scheduler, metrics and settings."""
        raise NotImplementedError(f'{type(self).__name__} cannot remove adapters.')

    @remote_method('all', 'first')
    @abstractmethod
    def clip_grad_and_step(
        self, max_norm: float | None = 1.0, *, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Clip gradients, optimizer step, LR step and zero_grad (honouring gradient accumulation)."""

    @remote_method('all', 'first')
    @abstractmethod
    def clip_grad_norm(self, max_norm: float | None = 1.0, *, adapter_name: str | None = None) -> float:
        """Clip gradients to `max_norm` (None: measure only); returns the total norm before clipping."""

    @remote_method('all', 'none')
    @abstractmethod
    def step(self, *, adapter_name: str | None = None) -> None:
        """Optimizer step (no clipping, no accumulation bookkeeping)."""

    @remote_method('all', 'none')
    @abstractmethod
    def zero_grad(self, *, adapter_name: str | None = None) -> None:
        """Drop accumulated gradients."""

    @remote_method('all', 'none')
    @abstractmethod
    def lr_step(self, *, adapter_name: str | None = None) -> None:
        """Advance the LR scheduler one step."""

    @remote_method('all', 'first', mutates=False)
    @abstractmethod
    def calculate_metric(self, is_training: bool = True, *, adapter_name: str | None = None) -> dict[str, Any]:
        """Metrics since the last call (loss, token accuracy, grad norm, lr, tokens/s), then reset them."""

    @remote_method('all', 'first', mutates=False)
    @abstractmethod
    def get_train_configs(self, *, adapter_name: str | None = None) -> dict[str, Any]:
        """A JSON-serialisable description of the training setup (model, adapter, optimizer, loss, ...)."""

    @remote_method('first', 'first', mutates=False)
    def model_info(self) -> dict[str, Any]:
        """What an engine hosting this model needs to know, JSON-serialisable: ``model_id``, ``max_length``
        (longest accepted row; None: unbounded) and backend-specific extras (e.g. how passes were planned)."""
        raise NotImplementedError(f'{type(self).__name__} does not describe itself (model_info).')

    # ---- checkpoints ---------------------------------------------------------------------------------------
    @remote_method('all', 'first')  # every rank: gathering sharded (FSDP/TP) weights is collective; rank 0 writes
    @abstractmethod
    def save(
        self,
        name: str,
        *,
        output_dir: str | None = None,
        save_optimizer: bool = False,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Write a checkpoint; returns its directory. LoRA in PEFT format, full weights in HF format."""

    @remote_method('all', 'first')
    @abstractmethod
    def load(self, path: str, *, load_optimizer: bool = False, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Load a checkpoint written by `save` (weights, and optimizer/scheduler/RNG state when asked)."""

    # ---- weight export (the model half of the backend seam; collective over the model's ranks) ------------
    @remote_method('first', 'first', mutates=False)
    def list_adapters(self) -> list[str]:
        """Names of the LoRA adapters trained here, sorted ([] under full-parameter training)."""
        raise NotImplementedError(f'{type(self).__name__} does not export weights.')

    def trains_base(self) -> bool:
        """True when training changes the base weights (full-parameter training)."""
        raise NotImplementedError(f'{type(self).__name__} does not export weights.')

    def is_export_rank(self) -> bool:
        """True on the one rank whose exported buckets hold the tensors (the sender of a weight sync)."""
        raise NotImplementedError(f'{type(self).__name__} does not export weights.')

    def weight_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Hugging Face weight name -> (dtype name, full unsharded shape), without gathering anything."""
        raise NotImplementedError(f'{type(self).__name__} does not export weights.')

    def export_base(self, *, bucket_bytes: int = 256 << 20) -> Iterator[list[tuple[str, Any]]]:
        """Buckets of (Hugging Face name, full tensor) of every base weight: filled on the export rank, empty
        elsewhere; every rank must iterate to the end (sharded weights are gathered collectively)."""
        raise NotImplementedError(f'{type(self).__name__} does not export weights.')

    def export_adapter(
        self, name: str, *, bucket_bytes: int = 256 << 20
    ) -> tuple[dict[str, Any], Iterator[list[tuple[str, Any]]]]:
        """(adapter_config.json fields, buckets keyed as in adapter_model.safetensors) of adapter `name`; same
        collective rules as `export_base`."""
        raise NotImplementedError(f'{type(self).__name__} does not export weights.')


def component_arg(method: str, value: Any, keyword: str, keyword_value: Any) -> Any:
    """The component a ``set_*`` call names, given positionally (`value`) or by Twinkle's keyword (e.g.
    ``set_optimizer(optimizer_cls='AdamW')``): exactly one of the two. Raises TypeError otherwise."""
    if (value is None) == (keyword_value is None):
        given = 'both' if value is not None else 'neither'
        raise TypeError(
            f'{method}() takes the component either positionally or as {keyword}=, exactly once '
            f"({given} given); e.g. {method}('AdamW', lr=1e-4) or {method}({keyword}='AdamW', "
            f'lr=1e-4).'
        )
    return value if value is not None else keyword_value


def reject_unknown_kwargs(method: str, kwargs: dict[str, Any], accepted: tuple[str, ...]) -> None:
    """Raise TypeError when a model method got keywords nothing consumes (never ignore them silently)."""
    if kwargs:
        raise TypeError(
            f'{method}() got unexpected keyword arguments {sorted(kwargs)}; it accepts '
            f'{", ".join(accepted)}. Per-row and per-token training data (advantages, old_logps, '
            f'ref_logps, weights, ...) go in the rows themselves (docs/conventions.md); per-adapter '
            f'settings go through set_loss / set_processor / ...'
        )
