"""vLLMSampler: the `Sampler` contract on a vLLM engine (continuous batching, paged KV cache, multi-LoRA).

    sampler = vLLMSampler('path/to/model', engine_args={'max_model_len': 2048, 'max_lora_rank': 32})
    sampler.add_adapter('tenant-a', path='ckpt/tenant-a')           # a PEFT directory (or config + tensors)
    responses = sampler.sample(prompts, SamplingParams(max_tokens=64, temperature=0.7, seed=1, num_samples=4),
                               adapter_name=['tenant-a', None])

Results have the same types and meaning as `TorchSampler`'s (docs/sampling.md): one `SampleResponse` per prompt;
`logprobs` are the raw model log-softmax of each sampled token (vLLM ``logprobs_mode='raw_logprobs'``), i.e. what
the training forward computes; the stopping token (EOS, a stop id, the token completing a stop string) is part of
`tokens`; a seeded request gives sample `s` its own seed (`sequence_seed`), so it reproduces whatever else runs
with it (identical prompts of one call are told apart by their occurrence). Prompts are validated here (vocabulary,
`max_model_len`, adapters) before vLLM sees them: an error inside vLLM's engine process kills the engine.

vLLM's engine core runs in its own process unless ``multiprocess=False`` (or vLLM's own
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, where this process has no torch.distributed group); weights reach it through
`collective_rpc` into `TwinkleWorkerExtension`, bucket by bucket, so updates work in both modes. A dead engine
is restarted (`twinkle_vllm.llm_handle.LLMHandle`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.hub.download import snapshot
from twinkle_core.hub.ref import HubRef, is_hub_ref
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
from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_vllm.adapters import AdapterTable
from twinkle_vllm.engine_args import engine_args as build_engine_args
from twinkle_vllm.llm_handle import LLMHandle, engine_in_own_process
from twinkle_vllm.translation import sample_response, text_prompt, vllm_params
from twinkle_vllm.weights import CheckpointLayout, LayerStager, serialized_buckets


class vLLMSampler(Sampler):  # noqa: N801 - the documented Twinkle name
    """`model_id`: a local model directory (or an ``ms://`` / ``hf://`` id resolved offline). `engine_args`:
    keyword arguments of `vllm.LLM` over our defaults (`twinkle_vllm.engine_args.defaults`); unknown names raise.
    `device_mesh`: its `tp` size becomes the engine's tensor parallelism (data parallelism is one sampler per
    rank, e.g. a Ray group). `multiprocess`: run vLLM's engine core in its own process (True); False runs it in
    this process: a faster start, but a crash in the engine takes the caller with it. None (the default): vLLM's own
    switch, ``VLLM_ENABLE_V1_MULTIPROCESSING`` (on unless ``0``), and always its own process where this process
    already has a torch.distributed group (`twinkle_vllm.llm_handle.engine_in_own_process`).
    `bucket_bytes`: the largest weight bucket one RPC carries during `load_weights`."""

    #: what holds for every instance; each one refines `max_adapters` (vLLM's ``max_cpu_loras``; 0 without LoRA),
    #: `max_top_logprobs` (the engine's ``max_logprobs``, 20 by default) and `weights_in_process`
    #: (``multiprocess=False``) from its arguments. vLLM places itself: no ``device=``. Prompt top-k comes from
    #: vLLM's ``prompt_logprobs=k``; log-probs of arbitrary ids and draws at prompt positions need the full
    #: distribution there, which vLLM does not return: not supported.
    capabilities = SamplerCapabilities(
        per_row_adapters=True,
        max_adapters=None,
        max_adapters_per_call=None,
        prompt_logprobs=True,
        max_top_logprobs=20,
        prompt_top_logprobs=True,
        prompt_target_logprobs=False,
        prompt_alt_tokens=False,
        adapter_from_tensors=False,
        weights_in_process=False,
        takes_device=False,
    )

    def __init__(
        self,
        model_id: str | os.PathLike[str],
        *,
        engine_args: Mapping[str, Any] | None = None,
        template: Any = None,
        device_mesh: Any = None,
        multiprocess: bool | None = None,
        bucket_bytes: int = 256 << 20,
    ) -> None:
        import torch

        self.model_id = _local_dir(model_id)
        on_cpu = not torch.cuda.is_available()
        user = dict(engine_args or {})
        if on_cpu:
            user.setdefault('dtype', 'float32')  # bf16 matmuls are slow on CPU; fp32 matches the training forward
        tp = device_mesh.size('tp') if device_mesh is not None else None
        args = build_engine_args(self.model_id, user, on_cpu=on_cpu, tensor_parallel_size=tp)
        self._layout = CheckpointLayout.read(self.model_id)  # before the engine: a bad directory fails fast
        multiprocess = engine_in_own_process(multiprocess)
        self._handle = LLMHandle(args, multiprocess=multiprocess)
        self._codec = TextCodec(self._handle.llm.get_tokenizer(), self.model_id)
        model_config = self._handle.llm_engine.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        self._stager = LayerStager(self._layout)
        self._updating = False  # inside begin_weight_update() .. end_weight_update()
        self._loaded: set[str] = set()  # base weights applied by the current update
        self.bucket_bytes = bucket_bytes
        lora = self._handle.llm_engine.vllm_config.lora_config
        self._adapters = AdapterTable(self._handle, max_rank=args.get('max_lora_rank', 0), enabled=lora is not None)
        self._handle.on_restart.append(self._adapters.restore)
        max_logprobs = int(model_config.max_logprobs)
        self.capabilities = dataclasses.replace(
            type(self).capabilities,
            max_adapters=lora.max_cpu_loras if lora is not None else 0,
            max_top_logprobs=None if max_logprobs < 0 else max_logprobs,
            weights_in_process=not multiprocess,
        )
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
        `should_stop` is ignored (``capabilities.stops_rows`` is False): one `LLM.generate` call runs every
        request to its end. `occurrences`: each prompt's index among identical prompts of the whole call (see
        `Sampler.sample`)."""
        del should_stop
        params = as_sampling_params(sampling_params, kwargs)
        rows = prompt_rows(inputs)
        prompts = [text_prompt(encode_prompt_row(row, i, self._codec.encode_chat_row), i) for i, row in enumerate(rows)]
        adapters = adapters_per_prompt(adapter_name, rows)
        self._validate(prompts, adapters, params)
        occurrences = resolve_occurrences(occurrences, prompts, adapters)
        if self._handle.weights_lost:
            raise TwinkleError(
                'The vLLM engine was restarted and lost the base weights loaded into it; load them '
                'again (begin_weight_update / load_weights / end_weight_update) before sampling.'
            )
        requests = [
            (i, seq_params)
            for i, (prompt, nth) in enumerate(zip(prompts, occurrences))
            for seq_params in vllm_params(params, prompt, nth)
        ]
        outputs = self._generate(
            [prompts[i] for i, _ in requests],
            [p for _, p in requests],
            [adapters[i] for i, _ in requests],
            one_per_call=params.scores_prompt,
        )
        per_prompt: dict[int, list[Any]] = {}
        for (i, _), out in zip(requests, outputs):
            per_prompt.setdefault(i, []).append(out)
        return [
            sample_response(rows[i], prompts[i], per_prompt[i], params, self._codec.decode) for i in range(len(prompts))
        ]

    def load_weights(
        self,
        named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any] | str,
        *,
        adapter_name: str | None = None,
        lora_config: Any = None,
        **kwargs: Any,
    ) -> None:
        """Base weights (Hugging Face names; PEFT wrapper prefixes accepted), checked against the checkpoint's
        names and shapes before anything is sent, then copied into the engine's workers in buckets of whole decoder
        layers (see `twinkle_vllm.weights`). Between `begin_weight_update` and `end_weight_update` a layer may be
        split across calls (a streamed update); outside, each call must carry whole layers. `adapter_name` given:
        `add_adapter`."""
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
        pairs = self._layout.checked(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        ready = self._stager.add(pairs)
        if not self._updating:
            self._refuse_partial_layers()
        for blob in serialized_buckets(ready, self.bucket_bytes):
            self._handle.call('load_weights', functools.partial(_load_bucket, blob=blob))
            self._handle.base_loaded = True
        self._loaded.update(name for layer in ready for name, _ in layer)
        if not self._updating:
            self._finish_update()

    def begin_weight_update(self) -> None:
        self._stager.clear()
        self._loaded.clear()
        self._updating = True

    def end_weight_update(self) -> None:
        self._updating = False
        try:
            self._refuse_partial_layers()
        finally:
            self._finish_update()

    def _finish_update(self) -> None:
        if self._handle.weights_lost and self._loaded >= self._layout.shapes.keys():
            self._handle.weights_lost = False  # every base weight was loaded again after a restart
        self._loaded.clear()
        self.reset_prefix_cache()

    def add_adapter(
        self, name: str, config: Any = None, tensors: Mapping[str, Any] | None = None, *, path: str | None = None
    ) -> None:
        self._adapters.add(name, config, tensors, path=path)

    def remove_adapter(self, name: str) -> None:
        self._adapters.remove(name)

    def list_adapters(self) -> list[str]:
        return self._adapters.names()

    def reset_prefix_cache(self) -> None:
        if not self._handle.call('reset_prefix_cache', lambda llm: llm.reset_prefix_cache()):
            raise TwinkleError('vLLM refused to reset its prefix cache (requests still running).')

    def _refuse_partial_layers(self) -> None:
        missing = self._stager.incomplete()
        self._stager.clear()
        if missing:
            layer, names = next(iter(missing.items()))
            raise InvalidInputError(
                f'load_weights got only part of {len(missing)} layer(s), e.g. {layer!r} without {names[:4]}; vLLM '
                'reloads whole layers, so nothing of those layers was applied. Send all weights of a layer in one '
                'update (one load_weights call, or several between begin_weight_update() and end_weight_update()).'
            )

    def shutdown(self) -> None:
        """Stop vLLM's engine (and its processes) and delete adapter directories this sampler wrote. Idempotent."""
        self._handle.shutdown()
        self._adapters.close()

    @property
    def tokenizer(self) -> Any:
        return self._codec.tokenizer

    # ---- helpers -------------------------------------------------------------------------------------------
    def _validate(self, prompts: list[list[int]], adapters: list[str | None], params: SamplingParams) -> None:
        for i, ids in enumerate(prompts):
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise InvalidInputError(f'Prompt {i} has token ids outside the vocabulary [0, {self.vocab_size}).')
            if len(ids) + params.max_tokens > self.max_model_len:
                raise InvalidInputError(
                    f"Prompt {i}: {len(ids)} prompt tokens + max_tokens={params.max_tokens} exceeds the engine's "
                    f'max_model_len={self.max_model_len}; lower max_tokens to at most '
                    f'{max(self.max_model_len - len(ids), 0)}, shorten the prompt, or raise '
                    "engine_args['max_model_len']."
                )
        max_logprobs = self._handle.llm_engine.vllm_config.model_config.max_logprobs
        widths = {
            'top_logprobs' if params.top_logprobs >= (params.logprob_pairs or 0) else 'logprobs': params.alternatives,
            'prompt_top_logprobs': params.prompt_top_logprobs,
        }
        for asked, width in widths.items():
            if max_logprobs >= 0 and width > max_logprobs:
                raise InvalidInputError(
                    f"{asked}={width} is above the engine's max_logprobs="
                    f"{max_logprobs}; ask for fewer or raise engine_args['max_logprobs']."
                )
        check_prompt_scoring(type(self).__name__, self.capabilities, prompts, params, self.vocab_size)
        self._adapters.check_known(adapters)

    def _generate(
        self, prompts: list[list[int]], params: list[Any], adapters: list[str | None], *, one_per_call: bool
    ) -> list[Any]:
        """`LLM.generate` over all requests (continuous batching). With prompt logprobs and LoRA enabled vLLM
        0.32 crashes on batched prompt-logprob requests, so those go one per call."""
        lora = [None if a is None else self._adapters.request(a) for a in adapters]
        batch = [{'prompt_token_ids': ids} for ids in prompts]
        if not (one_per_call and self._handle.llm_engine.vllm_config.lora_config is not None):
            return list(
                self._handle.call('sample', lambda llm: llm.generate(batch, params, lora_request=lora, use_tqdm=False))
            )
        return [
            out
            for j in range(len(batch))
            for out in self._handle.call(
                'sample',
                functools.partial(
                    _llm_generate, prompts=batch[j : j + 1], params=params[j : j + 1], lora=lora[j : j + 1]
                ),
            )
        ]


def _load_bucket(llm: Any, blob: Any) -> Any:
    """Load one serialized weight bucket into every worker of the engine `llm`."""
    return llm.collective_rpc('twinkle_load_weights', args=(blob,))


def _llm_generate(llm: Any, prompts: list[Any], params: list[Any], lora: list[Any]) -> Any:
    """`LLM.generate` of `prompts` (one sampling params and LoRA request each) on the engine `llm`."""
    return llm.generate(prompts, params, lora_request=lora, use_tqdm=False)


def _local_dir(model_id: str | os.PathLike[str]) -> str:
    text = os.fspath(model_id)
    if is_hub_ref(text):
        return str(snapshot(HubRef.parse(text)))
    if not Path(text).is_dir():
        raise InvalidInputError(
            f'vLLMSampler: model directory {text!r} does not exist (pass a local directory or an ms:// / hf:// id).'
        )
    return str(Path(text).resolve())
