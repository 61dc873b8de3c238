"""Translating between the `Sampler` contract and vLLM's requests: twinkle `SamplingParams` -> vLLM sampling
parameters (`vllm_params`), vLLM's outputs -> `SampleResponse` (`sample_response`), and which prompts vLLM can take
(`text_prompt`)."""

from __future__ import annotations

from typing import Any, Callable

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.sampler.prompts import first_scored, sampled_sequence, sequence_seed
from twinkle_core.types import SampleResponse, SamplingParams


def vllm_params(params: SamplingParams, prompt: list[int], occurrence: int = 0) -> list[Any]:
    """vLLM sampling parameters for `prompt` (`occurrence`: its index among identical prompts of the call): one
    request with n samples, or (seeded and not greedy) one request per sample with that sample's own seed."""
    from vllm import SamplingParams as VllmParams

    common: dict[str, Any] = dict(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=params.stop_strings() or None,
        stop_token_ids=params.stop_token_ids() or None,
        logprobs=params.alternatives if params.logprobs is not False or params.top_logprobs else None,
        # k > 0: the prompt token and the k most likely at each position (vLLM's ranks say which is which)
        prompt_logprobs=params.prompt_top_logprobs if params.prompt_logprobs or params.prompt_top_logprobs else None,
        # text comes from our own decode (as TorchSampler's); vLLM's incremental detokenizer is
        # only needed to match stop strings
        detokenize=bool(params.stop_strings()),
    )
    if params.seed is None or params.temperature == 0:
        return [VllmParams(n=params.num_samples, **common)]
    return [
        VllmParams(n=1, seed=sequence_seed(params.seed, s, prompt, occurrence), **common)
        for s in range(params.num_samples)
    ]


def sample_response(
    row: Any, prompt: list[int], outputs: list[Any], params: SamplingParams, decode: Callable[[list[int]], str | None]
) -> SampleResponse:
    """vLLM's `RequestOutput`s of one prompt (one, or one per seeded sample) -> its `SampleResponse`."""
    sequences = []
    for out in outputs:
        for completion in out.outputs:
            if completion.finish_reason not in ('stop', 'length'):
                raise TwinkleError(f'vLLM ended a sequence with finish_reason={completion.finish_reason!r}.')
            tokens = list(completion.token_ids)
            steps = completion.logprobs or []
            logprobs = [float(step[t].logprob) for t, step in zip(tokens, steps)]
            top = [_ranked(step, params.alternatives) for step in steps] if params.alternatives else None
            sequences.append(
                sampled_sequence(params, row, prompt, tokens, logprobs, top, completion.finish_reason, decode(tokens))
            )
    prompt_logprobs: list[float | None] | None = None
    prompt_top: list[list[tuple[int, float]] | None] | None = None
    first = first_scored(len(prompt), params.prompt_logprobs_last_n)
    blank: list[None] = [None] * first
    if params.prompt_logprobs:
        raw = outputs[0].prompt_logprobs
        prompt_logprobs = [*blank, *(float(raw[p][prompt[p]].logprob) for p in range(first, len(prompt)))]
    if params.prompt_top_logprobs:
        raw = outputs[0].prompt_logprobs
        k = params.prompt_top_logprobs
        prompt_top = [*blank, *(_ranked(raw[p], k) for p in range(first, len(prompt)))]
    return SampleResponse(sequences=sequences, prompt_logprobs=prompt_logprobs, prompt_top_logprobs=prompt_top)


def text_prompt(encoded: dict[str, Any], index: int) -> list[int]:
    """The ids of a text prompt; image prompts are refused (their images would be silently dropped)."""
    if 'pixel_values' in encoded:
        raise InvalidInputError(
            f"Prompt {index} holds images: multimodal prompts need vLLM's multimodal input "
            'path (which needs torchvision) and are not supported by vLLMSampler yet; sample '
            'image prompts with TorchSampler.'
        )
    return encoded['input_ids']


def _ranked(step: dict[int, Any], k: int) -> list[tuple[int, float]]:
    """vLLM's logprobs of one step (the sampled token and the top k, each with its rank) -> the k most likely
    (token, log p), most likely first."""
    ranked = sorted((lp.rank, token, float(lp.logprob)) for token, lp in step.items() if lp.rank <= k)
    return [(token, logprob) for _, token, logprob in ranked[:k]]
