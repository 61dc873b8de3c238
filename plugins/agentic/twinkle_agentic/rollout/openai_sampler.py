"""`OpenAISampler`: a twinkle sampler over an OpenAI-compatible chat-completions endpoint (this project's `/v1`,
vLLM's server, OpenAI itself), for evaluating served models with `twinkle_core.eval.evaluate`.

    from openai import OpenAI
    sampler = OpenAISampler(OpenAI(base_url='http://127.0.0.1:8000/v1', api_key=key), model='Qwen3-0.6B')
    evaluate(sampler, 'ArithmeticTask').metrics          # adapter_name= picks another served model or checkpoint

Prompts are chat trajectories (``messages``, optionally ``tools``): the endpoint renders them with its own chat
template and parses tool calls. An endpoint returns text, not token ids: each sequence carries its ``text``, the
per-token log-probs the endpoint reports (``logprobs=True`` is always asked for, so a completion's length in tokens
is known) and, when the model called tools, the assistant message with its ``tool_calls`` as ``new_input_feature``;
``tokens`` stays empty, so these sequences are for scoring, not training.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.types import SampledSequence, SampleResponse, SamplingParams, StopReason

#: OpenAI finish_reason -> twinkle's stop reason (a turn that called tools stopped on its own)
FINISH_REASONS: dict[str, StopReason] = {'stop': 'stop', 'tool_calls': 'stop', 'length': 'length'}
#: `SamplingParams` fields a chat-completions request cannot carry, with their unset values
UNSUPPORTED: dict[str, Any] = {
    'prompt_logprobs': False,
    'prompt_top_logprobs': 0,
    'prompt_logprobs_last_n': None,
    'prompt_target_tokens': None,
    'prompt_alt_tokens': 0,
    'top_k': -1,
}


class OpenAISampler:
    """``sample(prompts, sampling_params, adapter_name=None) -> list[SampleResponse]`` through `api` (an
    ``openai.OpenAI`` client, or anything with ``chat.completions.create``): one request per prompt, `concurrency`
    in flight at once, in order. `model`: the served model asked for (`adapter_name` overrides it per call).
    `request_kwargs`: extra ``create`` arguments (e.g. ``{'extra_body': {...}}``). With a ``seed``, prompt i of a
    call samples with ``seed + i``."""

    def __init__(
        self,
        api: Any,
        model: str,
        *,
        concurrency: int = 8,
        timeout_s: float | None = None,
        request_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidInputError(f'OpenAISampler: concurrency must be >= 1, got {concurrency}')
        self.api, self.model, self.concurrency, self.timeout_s = api, model, concurrency, timeout_s
        self.request_kwargs = dict(request_kwargs or {})

    def sample(
        self,
        prompts: Sequence[Mapping[str, Any]],
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> list[SampleResponse]:
        """One `SampleResponse` per chat prompt, in order (module docstring)."""
        params = check_params(sampling_params)
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, Mapping) or not isinstance(prompt.get('messages'), list):
                raise InvalidInputError(
                    f'prompt {i}: OpenAISampler takes chat prompts ({{"messages": [...]}}); the endpoint renders '
                    'them with its own chat template (token ids cannot be sent).'
                )
        model = adapter_name or self.model
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(prompts)))) as pool:
            futures = [pool.submit(self._one, model, prompt, params, i) for i, prompt in enumerate(prompts)]
            return [f.result() for f in futures]

    def _one(self, model: str, prompt: Mapping[str, Any], params: SamplingParams, index: int) -> SampleResponse:
        request: dict[str, Any] = {
            'model': model,
            'messages': prompt['messages'],
            'n': params.num_samples,
            'max_tokens': params.max_tokens,
            'temperature': params.temperature,
            'top_p': params.top_p,
            'logprobs': True,
            **self.request_kwargs,
        }
        if params.seed is not None:
            request['seed'] = params.seed + index
        if params.stop:
            request['stop'] = params.stop
        if prompt.get('tools'):
            request['tools'] = prompt['tools']
        if self.timeout_s is not None:
            request['timeout'] = self.timeout_s
        completion = self.api.chat.completions.create(**request)
        return SampleResponse(sequences=[_sequence(prompt, choice) for choice in completion.choices])


def check_params(sampling_params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    """`sampling_params` validated; an `InvalidInputError` for what a chat-completions request cannot carry."""
    params = SamplingParams.model_validate(dict(sampling_params or {}))
    for name, unset in UNSUPPORTED.items():
        if getattr(params, name) != unset:
            raise InvalidInputError(
                f'OpenAISampler does not support SamplingParams.{name}: a chat-completions request cannot carry it.'
            )
    return params


def _sequence(prompt: Mapping[str, Any], choice: Any) -> SampledSequence:
    reason = FINISH_REASONS.get(choice.finish_reason)
    if reason is None:
        raise TwinkleError(f'the endpoint returned an unknown finish_reason {choice.finish_reason!r}')
    message = choice.message
    text = message.content or ''
    content = choice.logprobs.content if choice.logprobs is not None else None
    feature = None
    if message.tool_calls:
        calls = [
            {'id': c.id, 'type': 'function', 'function': {'name': c.function.name, 'arguments': c.function.arguments}}
            for c in message.tool_calls
        ]
        assistant = {'role': 'assistant', 'content': text, 'tool_calls': calls}
        feature = {**prompt, 'messages': [*prompt['messages'], assistant]}
    return SampledSequence(
        tokens=[],
        logprobs=[float(t.logprob) for t in content] if content is not None else None,
        stop_reason=reason,
        text=text,
        new_input_feature=feature,
    )
