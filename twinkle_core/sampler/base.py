"""The Sampler interface: prompts -> sampled continuations with per-token logprobs, plus the weight-import half of
the backend seam (docs/architecture.md §5): base weights streamed in Hugging Face names, LoRA adapters added,
replaced and removed by name in PEFT format, and declared capabilities.

A weight update runs ``begin_weight_update()`` -> ``load_weights(bucket)`` per bucket and/or ``add_adapter(...)``
-> ``end_weight_update()``; the end resets the prefix cache so no request is served from KV computed with the old
weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from twinkle_core.dispatch import remote_method
from twinkle_core.runtime.context import HostedComponentMeta
from twinkle_core.sampler.prompts import split_call_kwargs


@dataclass(frozen=True)
class SamplerCapabilities:
    """What a sampler can do, declared (callers plan with it instead of guessing from class names or constructor
    signatures). Every default describes the conservative case: a sampler that declares nothing is given one
    adapter per `sample` call, holds one adapter at a time, is not asked for prompt logprobs or top-k
    alternatives and is built with ``model_id`` and its own arguments only.

    Declare it as a class attribute (``capabilities = SamplerCapabilities(...)``): `takes_device` is read from the
    class before any instance exists. An instance may refine the other fields once it knows them (e.g. vLLM's
    adapter slots come from its engine arguments): ``self.capabilities = dataclasses.replace(type(self).capabilities,
    max_adapters=...)``.

    - `per_row_adapters`: one `sample` call may give each prompt its own adapter (``adapter_name=[...]``).
    - `max_adapters`: adapters resident at once (None: bounded by memory only; 0: no LoRA adapters).
    - `max_adapters_per_call`: distinct adapters one `sample` call may use (None: no limit of its own).
    - `prompt_logprobs`: `SamplingParams(prompt_logprobs=True)` is supported (and `prompt_logprobs_last_n`).
    - `max_top_logprobs`: the most (token, log-prob) alternatives per position the sampler returns
      (`SamplingParams.top_logprobs`, ``logprobs=k``, `prompt_top_logprobs`); None: any k up to the vocabulary;
      0: none.
    - `prompt_top_logprobs`: `SamplingParams.prompt_top_logprobs` (top-k at prompt positions) is supported.
    - `prompt_target_logprobs`: `SamplingParams.prompt_target_tokens` (log-probs of chosen ids at prompt
      positions) is supported.
    - `prompt_alt_tokens`: `SamplingParams.prompt_alt_tokens` (tokens drawn at prompt positions) is supported.
    - `adapter_from_tensors`: `add_adapter` takes in-memory tensors directly (False: they are written to a PEFT
      directory first).
    - `weights_in_process`: the model runs in the caller's process (False: e.g. vLLM's engine core; weights go
      through RPC).
    - `takes_device`: the constructor accepts ``device=`` (``'cpu'``, ``'cuda:1'``, ...); False: the sampler places
      itself (e.g. vLLM) and is built with ``model_id`` and its own arguments only.
    - `stops_rows`: `sample` honours ``should_stop=`` (see `Sampler.sample`): a prompt whose predicate turns true
      stops being decoded at the next decode step. False: its rows run to their end, and callers do not pass it."""

    per_row_adapters: bool = False
    max_adapters: int | None = 1
    max_adapters_per_call: int | None = None
    prompt_logprobs: bool = False
    max_top_logprobs: int | None = 0
    prompt_top_logprobs: bool = False
    prompt_target_logprobs: bool = False
    prompt_alt_tokens: bool = False
    adapter_from_tensors: bool = False
    weights_in_process: bool = False
    takes_device: bool = False
    stops_rows: bool = False


class Sampler(ABC, metaclass=HostedComponentMeta):
    capabilities: SamplerCapabilities = SamplerCapabilities()

    @remote_method('slice_dp', 'concat', mutates=False, row_kwargs=split_call_kwargs)
    @abstractmethod
    def sample(
        self,
        inputs: Any,
        sampling_params: Any = None,
        *,
        adapter_name: str | list[str | None] | None = None,
        should_stop: Callable[[int], bool] | None = None,
        occurrences: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """`inputs`: prompts (InputFeature dicts or Trajectories). Returns one `SampleResponse` per prompt.

        `should_stop` (in-process calls only; a sampler that declares ``capabilities.stops_rows``, and callers pass
        it to no other): called with a prompt's index in `inputs`, from the sampling thread, at least once per
        decode step while that prompt has rows being decoded; once it returns True the prompt's rows stop at that
        step as if they had finished, and are never decoded again (nor is a prompt that has not started). Their
        sequences hold the tokens sampled so far (none, if it never started), ``stop_reason='length'``: a cut-off
        answer the caller is expected to discard. Other prompts' results are unaffected. It must be cheap (e.g.
        ``threading.Event.is_set``) and must not raise.

        `occurrences`: one per prompt, its index among identical prompts (same token ids, same adapter) of the
        whole logical call, which enters its seed (`sequence_seed`: seeded copies of one prompt draw apart, the
        first keeps the stream it has alone). For a caller that splits one call over several `sample` calls (a Ray
        sampler group over its data ranks: `split_call_kwargs`), so that each part draws what it draws in the whole
        call. None: counted over this call's prompts (`prompt_occurrences`). Every sampler resolves it with
        `resolve_occurrences`."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_template(self, template: Any, **kwargs: Any) -> None:
        """Template used to encode Trajectory prompts and decode completions."""

    # ---- weight import -------------------------------------------------------------------------------------
    @remote_method('all', 'none')
    @abstractmethod
    def load_weights(self, named_tensors: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Base weights: (Hugging Face name, tensor) pairs copied in place; may be called once per bucket of a
        streamed update. `adapter_name` given: the same as ``add_adapter(adapter_name, kwargs.get('lora_config'),
        tensors)`` (or ``path=`` when `named_tensors` is a PEFT directory)."""

    @remote_method('all', 'none')
    def add_adapter(
        self,
        name: str,
        config: Mapping[str, Any] | Any = None,
        tensors: Mapping[str, Any] | None = None,
        *,
        path: str | None = None,
    ) -> None:
        """Add or replace LoRA adapter `name` from PEFT-format `tensors` plus its `config` (adapter_config.json
        fields), or from a PEFT directory `path`. A replaced adapter never serves results computed with its old
        weights. A failed replacement leaves the old adapter in place."""
        raise NotImplementedError(f'{type(self).__name__} does not support LoRA adapters.')

    @remote_method('all', 'none')
    def remove_adapter(self, name: str) -> None:
        """Free adapter `name`; unknown names raise InvalidInputError."""
        raise NotImplementedError(f'{type(self).__name__} does not support LoRA adapters.')

    @remote_method('first', 'first', mutates=False)
    def list_adapters(self) -> list[str]:
        """Names of the adapters this sampler can serve, sorted."""
        return []

    def shares_weights_with(self, model: Any) -> str:
        """In this process: 'all' when this sampler runs `model`'s very module (its adapters included), 'base'
        when it reads the same base weight storage, 'none' otherwise (weights must move)."""
        return 'none'

    @remote_method('all', 'none')
    def reset_prefix_cache(self) -> None:
        """Drop cached prompt KV (a sampler without a prefix cache does nothing)."""

    @remote_method('all', 'none')
    def begin_weight_update(self) -> None:
        """Called before a weight update: stop serving from the weights about to change."""

    @remote_method('all', 'none')
    def end_weight_update(self) -> None:
        """Called after a weight update: resume, with the prefix cache reset."""
        self.reset_prefix_cache()
