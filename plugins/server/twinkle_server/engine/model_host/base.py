"""`ModelHost`: the narrow interface the service runs on -- one hosted base model, many LoRA adapters, a sampler.

Everything here is called from the base model's worker thread only (see `engine/scheduler.py`), never from the
event loop, so implementations need no locking. The HTTP layers speak only this interface; which training
stack sits behind it (a backend and a sampler chosen by registry name, driven through their declared
capabilities) and where it runs (`local.LocalModelHost` in this process, `ray_deploy.RayModelHost` on Ray device
groups) is the implementation's business.

Rows are `InputFeature` dicts (docs/conventions.md): `labels` aligned with `input_ids`, per-token fields
(`weights`, `old_logps`, `advantages`) aligned the same way. Losses are sums over tokens (Tinker semantics):
gradients add up until `optim_step`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_server.errors import ApiError

ALL_LINEAR = 'all-linear'


@dataclass(frozen=True)
class LoraSpec:
    """What a client asked for. `targets` are module-name suffixes (attention and/or MLP, lm_head), or
    `('all-linear',)`; `options` are further peft `LoraConfig` fields (native API), validated by the backend."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    gradient_accumulation_steps: int = 1  # optimizer steps happen on every n-th clip_grad_and_step / step
    #: the adapter's optimizer family (`OPTIMIZERS`): Tinker's `optimizer_config.type`, kept by checkpoints
    optimizer: str = 'adamw'

    def as_dict(self) -> dict[str, Any]:
        return {
            'rank': self.rank,
            'alpha': self.alpha,
            'targets': list(self.targets),
            'seed': self.seed,
            'options': dict(self.options),
            'gradient_accumulation_steps': self.gradient_accumulation_steps,
            'optimizer': self.optimizer,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoraSpec:
        return cls(
            int(d['rank']),
            float(d['alpha']),
            tuple(d['targets']),
            d.get('seed'),
            d.get('options') or {},
            int(d.get('gradient_accumulation_steps', 1)),
            str(d.get('optimizer') or 'adamw'),  # checkpoints written before dimuon existed: AdamW
        )

    def peft_config(self) -> dict[str, Any]:
        """The adapter as `add_adapter_to_model` config (no dropout unless asked: Tinker trains without)."""
        targets: str | list[str] = ALL_LINEAR if self.targets == (ALL_LINEAR,) else list(self.targets)
        return {
            'lora_dropout': 0.0,
            **self.options,
            'r': self.rank,
            'lora_alpha': self.alpha,
            'target_modules': targets,
        }


@dataclass
class TrainBatch:
    """One tenant's share of a (possibly mixed) forward/backward pass."""

    adapter: str
    rows: list[dict[str, Any]]
    loss: str  # a registered name of kind `loss` ('' with `graph`)
    loss_args: dict[str, Any] = field(default_factory=dict)  # its constructor arguments
    forward_only: bool = False
    #: an uploaded custom loss instead of `loss` (`engine.custom_loss.program.CustomLossSpec.loss_config`)
    graph: dict[str, Any] | None = None


@dataclass
class TrainResult:
    loss: float  # the sum-reduced loss of this batch
    #: per row, aligned with input_ids (element 0 is a dummy): a float per token, or a list of K per token for
    #: candidate matrices (2-D target_tokens: soft targets, rank-2 custom losses)
    logprobs: list[list[Any]]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AdamStep:
    """Tinker `AdamParams`: every field is applied to the adapter's optimizer before it steps."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0 = no clipping

    def validate(self) -> None:
        """Raise a 400 naming the first bad field and its range (`ADAM_RANGES`): a NaN/Inf/negative or huge
        learning rate (or a beta outside [0, 1), eps <= 0, ...) would permanently break the adapter's weights and
        optimizer state, or fail the step inside the optimizer (a learning rate past float32's range)."""
        for name, allowed in ADAM_RANGES.items():
            value = getattr(self, name)
            if not math.isfinite(value) or not allowed.contains(value):
                raise ApiError(400, f'adam_params.{name} must be a finite number {allowed}, got {value!r}')


@dataclass
class DimuonStep:
    """Tinker `DimuonParams` (SDK 0.38: learning_rate, beta1, grad_clip_norm): applied to the adapter's `Dimuon`
    optimizer before it steps (its AdamW path, for non-matrix parameters, keeps beta2=0.95, eps=1e-12)."""

    learning_rate: float
    beta1: float = 0.9
    grad_clip_norm: float = 0.0  # <= 0 = no clipping

    def validate(self) -> None:
        """Raise a 400 naming the first field outside `DIMUON_RANGES` (the AdamW counterpart is `ADAM_RANGES`)."""
        for name, allowed in DIMUON_RANGES.items():
            value = getattr(self, name)
            if not math.isfinite(value) or not allowed.contains(value):
                raise ApiError(400, f'dimuon params.{name} must be a finite number {allowed}, got {value!r}')


#: what an adapter's `optim_step` takes, by optimizer family (`LoraSpec.optimizer`)
OptimStep = AdamStep | DimuonStep
OPTIMIZERS: dict[str, type[AdamStep] | type[DimuonStep]] = {'adamw': AdamStep, 'dimuon': DimuonStep}


@dataclass(frozen=True)
class Range:
    """An interval of numbers: ``[low, high]``, either end open."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        return f'in {"(" if self.low_open else "["}{self.low:g}, {self.high:g}{")" if self.high_open else "]"}'


#: the AdamParams an optimizer step accepts (wider than any sensible run, narrow enough to keep float32 finite)
ADAM_RANGES: dict[str, Range] = {
    'learning_rate': Range(0, 10),
    'beta1': Range(0, 1, high_open=True),
    'beta2': Range(0, 1, high_open=True),
    'eps': Range(0, 1, low_open=True),
    'weight_decay': Range(0, 10),
    'grad_clip_norm': Range(0, 1e30),
}

#: the DimuonParams an optimizer step accepts. The SDK already refuses lr < 0, beta1 outside [0, 1) and NaN/Inf;
#: the step direction has Frobenius norm sqrt(rank), so lr bounds each matrix's change directly. A non-positive
#: grad_clip_norm means no clipping (as the SDK documents), so only its upper end is bounded.
DIMUON_RANGES: dict[str, Range] = {
    'learning_rate': Range(0, 10),
    'beta1': Range(0, 1, high_open=True),
    'grad_clip_norm': Range(-1e30, 1e30),
}


@dataclass
class SampleJob:
    """One prompt, `num_samples` continuations, from the adapter saved in `adapter_dir` (a checkpoint
    directory written by `save_state`) or, when None, the base model. A prompt with images has them expanded in
    `prompt` (image placeholder tokens) and their row fields in `images` (``pixel_values``, ``image_grid_thw``,
    ``mm_token_type_ids``; see `twinkle_core.template.vision`)."""

    prompt: list[int]
    params: SamplingParams
    num_samples: int = 1
    prompt_logprobs: bool = False
    adapter_dir: str | None = None
    images: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The prompt as the sampler's input row."""
        return {'input_ids': self.prompt, **self.images}


class ModelHost(ABC):
    """One hosted base model: adapters for training, a sampler for generation."""

    #: public name clients use (e.g. "Qwen/Qwen3-0.6B"), and the local directory holding weights + tokenizer
    base_model: str
    model_dir: str
    max_context_length: int
    #: the training backend's registry name, and the trainable adapters it holds at once (None: bounded by
    #: memory only); the service refuses more
    backend_name: str = ''
    max_adapters: int | None = None

    @abstractmethod
    def add_adapter(self, adapter: str, lora: LoraSpec) -> None:
        """Create a trainable adapter with a fresh optimizer of the family `lora.optimizer` (AdamW or Dimuon)."""

    @abstractmethod
    def remove_adapter(self, adapter: str) -> None:
        """Free an adapter and its optimizer state (no-op when unknown)."""

    @abstractmethod
    def has_adapter(self, adapter: str) -> bool: ...

    @abstractmethod
    def forward_backward(self, batches: list[TrainBatch]) -> list[TrainResult | BaseException]:
        """Run every batch (one per adapter) in the passes the backend finds fastest (one shared pass, groups or
        one by one); one batch's failure is returned in its slot and never touches another adapter's
        gradients."""

    def pass_stats(self) -> dict[str, int]:
        """How training work was split into passes so far (strategy counts); empty when the backend does not
        plan passes."""
        return {}

    @abstractmethod
    def optim_step(self, adapter: str, step: OptimStep) -> dict[str, float]:
        """Apply `step`'s hyper-parameters (an `AdamStep` for AdamW adapters, a `DimuonStep` for Dimuon ones), clip,
        step and zero the adapter's gradients. Returns metrics."""

    @abstractmethod
    def save_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        """Adapter weights (PEFT format) + LoRA config, and optimizer state when asked, into `directory`."""

    @abstractmethod
    def load_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        """Replace the adapter's weights (and optimizer state when asked) with a `save_state` directory."""

    @abstractmethod
    def sample(
        self, jobs: list[SampleJob], should_stop: Callable[[int], bool] | None = None
    ) -> list[SampleResponse | BaseException]:
        """Generate for every job (batched where possible); failures are returned in their slot. The host
        loads adapters from `adapter_dir` as needed and bounds how many it keeps in memory. `should_stop(job
        index)` True: that job was cancelled; where its sampler declares `stops_rows` its rows stop at the next
        decode step (its answer, cut short, is to be discarded), elsewhere it runs to its end."""

    @abstractmethod
    def native_call(self, adapter: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Call a `Model` interface method for `adapter` (the native API; `method` is already whitelisted)."""

    def checkpoint_written(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        """`save_state` of `adapter` is now committed at `directory` (its final place: `save_state` itself wrote
        into a temporary one). Hosts that can lose their workers restore adapters from here."""

    def close(self) -> None:
        """Release what the host holds outside this process (e.g. Ray actors); called once at shutdown."""
