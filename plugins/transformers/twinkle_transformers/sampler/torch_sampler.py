"""TorchSampler: batched KV-cache generation on a Hugging Face causal LM, with per-request LoRA adapters.

    sampler = TorchSampler('path/to/model')                       # own copy of the weights
    sampler = TorchSampler(model=hf_model_or_transformers_model)   # shares the weights of a training model
    responses = sampler.sample(prompts, SamplingParams(max_tokens=64, temperature=0.7, seed=1, num_samples=4),
                               adapter_name=['tenant-a', None, 'tenant-b'])

Contract (see docs/sampling.md):
- one `SampleResponse` per prompt, `num_samples` sequences each, in input order;
- `logprobs[i]` is the model's log-softmax (temperature 1, no top-k/top-p) of the sampled token, i.e. the value the
  training forward computes for the same token -- not the log-probability under the filtered sampling distribution;
- stops at EOS and at `stop` token ids/strings; the stopping token is included (see `stopping.py`);
- a fixed `seed` reproduces the same tokens for the same prompt and settings, whatever else is in the batch
  (each sequence has its own random stream; see `sampling.py`), up to floating-point ties between near-equal
  logits computed at different batch shapes;
- ``should_stop=`` (declared: `capabilities.stops_rows`) stops a prompt's rows at the next decode step once it
  returns True for the prompt's index (a cancelled request); a batch's other rows are unaffected;
- `adapter_name=None` runs the base weights of the sampler's own model; a sampler sharing a LoRA model runs the
  model's adapter (what it trains; several adapters: refused, name one) and ``adapter_name='__base__'``
  (`BASE_WEIGHTS`) its base weights; a list gives one adapter per prompt (mixed in one batch);
- vision-language models (Qwen3-VL, Qwen3.5) sample from image prompts: Trajectories with images (encoded by the
  set template; a `VisionTemplate` of the model when none is set) or encoded rows with ``pixel_values``,
  ``image_grid_thw`` and ``mm_token_type_ids``. Each sample's ``new_input_feature`` carries the prompt's image
  fields, so it trains as is (see `vision_inputs.py` for the positions). Image placeholder tokens are never
  sampled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.kernel import apply_kernels
from twinkle_core.sampler.base import Sampler, SamplerCapabilities
from twinkle_core.sampler.codec import TextCodec
from twinkle_core.sampler.prompts import (
    adapters_per_prompt,
    as_sampling_params,
    check_prompt_scoring,
    encode_prompt_row,
    prompt_rows,
    resolve_occurrences,
)
from twinkle_core.types import SampleResponse, SamplingParams, Trajectory
from twinkle_transformers import vision
from twinkle_transformers.export import ModuleWeights, copy_base_weights
from twinkle_transformers.sampler import adapters as lora
from twinkle_transformers.sampler.batching import decode_batches, eval_mode, prompt_jobs
from twinkle_transformers.sampler.decoding import BatchDecoder
from twinkle_transformers.sampler.fast_decode import FastDecoder
from twinkle_transformers.sampler.jobs import PromptResult, PromptScoring, sample_response
from twinkle_transformers.sampler.model_source import ModelSource, open_model, unwrap_module
from twinkle_transformers.sampler.prefix_cache import (
    DEFAULT_PREFIX_CACHE_BYTES,
    PrefixCache,
    reuses_prefixes,
    weights_fingerprint,
)
from twinkle_transformers.sampler.sampling import TokenChooser
from twinkle_transformers.sampler.stopping import StopCondition
from twinkle_transformers.sampler.token_ids import eos_token_ids, pad_token_id
from twinkle_transformers.sampler.vision_inputs import PromptImages, prompt_images


class TorchSampler(Sampler):
    """Native sampler. `model_id`: a local model directory (or hub id resolvable offline); or `model`: a
    `transformers` model, PEFT model, or a twinkle `TransformersModel` whose weights are shared (no copy).
    `max_batch_size` bounds the number of sequences decoded together (prompts x samples). `fast_decode`: use the
    lean Llama-family decode step where supported (`fast_decode.py`; fuses q/k/v and gate/up weights in place
    for a model the sampler loaded itself); False always uses the model's HF forward. `kernels`: layer kernels
    installed for inference into a model the sampler loaded itself (`twinkle_core.kernel.apply_kernels`; they run
    in the HF forward -- prompts, and every step without `fast_decode`; `self.kernels` counts the replacements).
    `prefix_cache_bytes`: the budget of keys/values kept from finished sequences, so that a prompt extending one
    (the next turn of a multi-turn rollout) prefills only its new tokens (`prefix_cache.py`; 0 turns it off;
    `prefix_cache_stats` counts the reuse)."""

    #: `adapter_name` of the base weights where None means a shared model's adapter (`adapters.default_adapters`)
    BASE_WEIGHTS = lora.BASE_WEIGHTS

    #: adapters mixed per row, any number resident; every prompt score (top-k of any width, target ids, draws);
    #: the model lives in this process, placed by ``device=``; a prompt's rows stop mid-decode on ``should_stop``
    capabilities = SamplerCapabilities(
        per_row_adapters=True,
        max_adapters=None,
        max_adapters_per_call=None,
        prompt_logprobs=True,
        max_top_logprobs=None,
        prompt_top_logprobs=True,
        prompt_target_logprobs=True,
        prompt_alt_tokens=True,
        adapter_from_tensors=True,
        weights_in_process=True,
        takes_device=True,
        stops_rows=True,
    )

    def __init__(
        self,
        model_id: str | os.PathLike[str] | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        template: Any = None,
        device: str | torch.device | None = None,
        dtype: Any = None,
        max_batch_size: int = 64,
        fast_decode: bool = True,
        kernels: Sequence[Any] = (),
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> None:
        if max_batch_size < 1:
            raise InvalidInputError(f'max_batch_size must be >= 1, got {max_batch_size}.')
        if prefix_cache_bytes < 0:
            raise InvalidInputError(f'prefix_cache_bytes must be >= 0 (0: no prefix cache), got {prefix_cache_bytes}.')
        source: ModelSource = open_model(model_id, model=model, tokenizer=tokenizer, device=device, dtype=dtype)
        if kernels and not source.owned:
            raise InvalidInputError(
                'kernels= needs a model the sampler loads itself (model_id=); this one shares '
                'its module with a training model: install the kernels there instead.'
            )
        device_type = next(source.module.parameters()).device.type
        self.kernels = apply_kernels(source.module, kernels, mode='inference', device=device_type)
        self.model_id = source.model_id
        self._model = source.module
        self._owner = source.owner
        self._owned = source.owned
        self._fast_decode = fast_decode
        self._fast: tuple[torch.nn.Module, FastDecoder | None] | None = None
        self._adapters = lora.adapter_backend(self._model, owned=source.owned)
        self._codec = TextCodec(source.tokenizer, self.model_id)
        self.max_batch_size = max_batch_size
        self._prefix_cache = PrefixCache(prefix_cache_bytes)
        if template is not None:
            self.set_template(template)

    # ---- Sampler interface ---------------------------------------------------------------------------------
    def set_template(self, template: Any, model_id: Any = None, **kwargs: Any) -> None:
        """Template by name (kind ``template``), class or instance (see `TextCodec.set_template`)."""
        self._codec.set_template(template, model_id, **kwargs)

    def sample(
        self,
        inputs: Any,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        *,
        adapter_name: str | list[str | None] | None = None,
        should_stop: Callable[[int], bool] | None = None,
        occurrences: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> list[SampleResponse]:
        """Sample continuations; `kwargs` override fields of `sampling_params` (e.g. ``max_tokens=16``).
        `should_stop(prompt index)`: checked once per decode step; True stops that prompt's rows. `occurrences`: each
        prompt's index among identical prompts of the whole call (see `Sampler.sample`)."""
        params = as_sampling_params(sampling_params, kwargs)
        model = self.model
        rows = prompt_rows(inputs)
        encode = self._encode_chat if self._codec.can_encode_chat or self._vision_language else None
        encoded = [encode_prompt_row(row, i, encode) for i, row in enumerate(rows)]
        prompts = [e['input_ids'] for e in encoded]
        images = [prompt_images(e, i, model.config) if 'pixel_values' in e else None for i, e in enumerate(encoded)]
        adapters = lora.default_adapters(
            self._adapters, adapters_per_prompt(adapter_name, rows), shared=not self._owned
        )
        self._validate(prompts, adapters, params)
        occurrences = resolve_occurrences(occurrences, prompts, adapters)
        by_adapter = self._split_by_adapter(model, images, adapters)
        stop = StopCondition(
            max_tokens=params.max_tokens,
            stop_token_ids=frozenset(params.stop_token_ids()) | eos_token_ids(self._model, self.tokenizer),
            stop_strings=tuple(params.stop_strings()),
            decode=self._decode_raw if params.stop_strings() else None,
        )
        chooser = TokenChooser(params.temperature, params.top_k, params.top_p)
        jobs = prompt_jobs(prompts, adapters, params, self.device, chooser.greedy, images, occurrences)
        scoring = PromptScoring(
            logprobs=params.prompt_logprobs,
            top_k=params.prompt_top_logprobs,
            last_n=params.prompt_logprobs_last_n,
            targets=params.prompt_target_tokens,
            alt_k=params.prompt_alt_tokens,
            alt_temperature=params.temperature,
        )
        results: dict[int, list[PromptResult]] = {}
        decoder = BatchDecoder(
            model,
            pad_token_id=pad_token_id(self._model, self.tokenizer),
            route=self._adapters.routed,
            fast=self._fast_decoder(model),
            vision_language=self._vision_language,
            prefix_cache=self._live_prefix_cache(model),
        )
        with eval_mode(model):
            for batch in decode_batches(jobs, self.max_batch_size, by_adapter=by_adapter):
                outputs = decoder.decode(
                    [job for _, job in batch],
                    chooser,
                    stop,
                    scoring=scoring,
                    top_logprobs=params.alternatives,
                    halt=_per_job(should_stop, [prompt_index for prompt_index, _ in batch]),
                )
                for (prompt_index, _), out in zip(batch, outputs):
                    results.setdefault(prompt_index, []).append(out)
        return [
            sample_response(rows[i], encoded[i], results[i], params, self._codec.decode) for i in range(len(prompts))
        ]

    def load_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor] | str,
        *,
        adapter_name: str | None = None,
        lora_config: Any = None,
        **kwargs: Any,
    ) -> None:
        """Copy base weights in place (names as in the plain Hugging Face model's state dict; PEFT wrapper prefixes
        are accepted). `adapter_name` given: `add_adapter` from PEFT-format tensors or a PEFT directory."""
        if adapter_name is not None:
            if isinstance(named_tensors, (str, os.PathLike)):
                self.add_adapter(adapter_name, lora_config, path=os.fspath(named_tensors))
            else:
                self.add_adapter(adapter_name, lora_config, dict(named_tensors))
            return
        if isinstance(named_tensors, (str, os.PathLike)):
            raise InvalidInputError(
                'load_weights(path) without adapter_name is not supported; pass (name, tensor) '
                'pairs, or adapter_name=... for a PEFT adapter directory.'
            )
        self._prefix_cache.clear()
        copy_base_weights(self.model, named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)

    def add_adapter(
        self,
        name: str,
        config: Any = None,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        path: str | None = None,
    ) -> None:
        source: Path | dict[str, torch.Tensor]
        if name == lora.BASE_WEIGHTS:
            raise InvalidInputError(f'{name!r} names the base weights; give the adapter another name.')
        if tensors is not None and path is None:
            source = dict(tensors)
        elif path is not None and tensors is None:
            source = Path(path)
        else:
            raise InvalidInputError(f'add_adapter({name!r}): pass exactly one of tensors= or path=.')
        self.model  # noqa: B018 - follow a shared owner's current module first
        self._prefix_cache.clear()
        self._adapters.load(name, source, config)

    def remove_adapter(self, name: str) -> None:
        lora.check_adapters(self._adapters, [name])
        self._prefix_cache.clear()
        self._adapters.remove(name)

    def list_adapters(self) -> list[str]:
        return self.adapter_names

    def shares_weights_with(self, model: Any) -> str:
        try:
            other = unwrap_module(model)  # a twinkle model, a ModuleWeights or a torch module
        except InvalidInputError:  # not a torch-backed model of this process
            return 'none'
        mine = self.model
        if mine is other:
            return 'all'
        ours, theirs = ModuleWeights(mine).base_storage(), ModuleWeights(other).base_storage()
        return 'base' if ours.keys() == theirs.keys() and ours == theirs else 'none'

    # ---- introspection -------------------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The underlying `transformers` (or PEFT) module. For a shared twinkle model it is re-read from the owner
        on every use, so a model that gained a PEFT wrapper after the sampler was built is followed."""
        if self._owner is not None:
            module = unwrap_module(self._owner)
            if module is not self._model:
                self._model, self._adapters = module, lora.adapter_backend(module, owned=False)
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._codec.tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._codec.tokenizer = value

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    @property
    def adapter_names(self) -> list[str]:
        return sorted(self._adapters.names())

    @property
    def _vision_language(self) -> bool:
        return vision.is_vision_language(getattr(self.model, 'config', None))

    @property
    def prefix_cache_stats(self) -> dict[str, int]:
        """Prompts looked up in the prefix cache, hits, their prompt tokens and the tokens not prefilled again, plus
        the cache's current entries and bytes."""
        cache = self._prefix_cache
        return {**cache.stats.as_dict(), 'entries': len(cache), 'bytes': cache.bytes}

    # ---- helpers -------------------------------------------------------------------------------------------
    def _live_prefix_cache(self, model: torch.nn.Module) -> PrefixCache | None:
        """The prefix cache, emptied when the weights changed since its entries were computed; None for a model
        whose cache it cannot hold."""
        if not self._prefix_cache.enabled or not reuses_prefixes(getattr(model, 'config', None)):
            return None
        self._prefix_cache.check_weights(weights_fingerprint(model, self.adapter_names))
        return self._prefix_cache

    def _encode_chat(self, trajectory: Trajectory) -> dict[str, Any]:
        """A Trajectory's encoded prompt; a vision-language model without a set template gets its VisionTemplate."""
        if self._codec.template is None and self._vision_language:
            source = self.model_id if self.model_id and os.path.isdir(self.model_id) else None
            self.set_template('VisionTemplate', model_id=source)
        return self._codec.encode_chat_row(trajectory)

    def _split_by_adapter(
        self, model: torch.nn.Module, images: list[PromptImages | None], adapters: list[str | None]
    ) -> bool:
        """Whether batches must hold one adapter each: image prompts whose adapters have LoRA weights in the vision
        tower, whose inputs are image patches, not batch rows (per-row routing cannot reach them)."""
        if not any(image is not None for image in images):
            return False
        tower = vision.vision_tower(model)
        adapted = self._adapters.names_in(tower) & set(adapters) if tower is not None else set()
        if not adapted:
            return False
        unroutable = sorted(adapted - self._adapters.uniform_names())
        if unroutable:
            raise InvalidInputError(
                f'Adapter(s) {unroutable} have LoRA weights in the vision tower, which PEFT cannot route per batch '
                'row (its inputs are image patches); sample image prompts with the active adapter or the base model, '
                'or build the sampler from model_id= (twinkle multi-LoRA routes whole batches per adapter).'
            )
        return True

    def _decode_raw(self, token_ids: list[int]) -> str:
        return self._codec.decode(token_ids, skip_special_tokens=False) or ''

    def _fast_decoder(self, model: torch.nn.Module) -> FastDecoder | None:
        if not self._fast_decode:
            return None
        if self._fast is None or self._fast[0] is not model:
            self._fast = (model, FastDecoder.for_model(model, fuse=self._owned))
        return self._fast[1]

    def _validate(self, prompts: list[list[int]], adapters: list[str | None], params: SamplingParams) -> None:
        config = vision.language_config(self._model.config)
        vocab = getattr(config, 'vocab_size', None)
        context = getattr(config, 'max_position_embeddings', None)
        for i, ids in enumerate(prompts):
            if vocab is not None and (min(ids) < 0 or max(ids) >= vocab):
                raise InvalidInputError(f'Prompt {i} has token ids outside the vocabulary [0, {vocab}).')
            if context is not None and len(ids) + params.max_tokens > context:
                raise InvalidInputError(
                    f'Prompt {i}: {len(ids)} prompt tokens + max_tokens={params.max_tokens} exceeds the model '
                    f'context of {context} tokens; lower max_tokens to at most {max(context - len(ids), 0)} or '
                    f'shorten the prompt.'
                )
        lora.check_adapters(self._adapters, adapters)
        check_prompt_scoring(type(self).__name__, self.capabilities, prompts, params, vocab)
        if params.stop_strings() and self._codec.template is None and self.tokenizer is None:
            raise InvalidInputError(
                'Stop strings need a tokenizer or template to decode tokens; call '
                'set_template(...) or pass stop token ids instead.'
            )


def _per_job(should_stop: Callable[[int], bool] | None, prompts: list[int]) -> Callable[[int], bool] | None:
    """`should_stop` over prompt indices as a predicate over a batch's jobs (job j samples prompt `prompts[j]`)."""
    if should_stop is None:
        return None
    asked = should_stop
    return lambda job: asked(prompts[job])
