"""Agentic RL through a Tinker-compatible service: `TinkerSampler` lets `MultiTurnRollout` sample with the official
`tinker` SDK's `SamplingClient`, and `episode_datum` / `sft_datum` turn its episodes into `tinker.Datum`s.

    sampler = TinkerSampler(training.save_weights_and_get_sampling_client().result())
    rollout = MultiTurnRollout(sampler, tokenizer, env='GuessNumberEnv', sampling_params={'max_tokens': 8})
    episodes = rollout(games)                                       # the rollout logic runs here, client-side
    data = [episode_datum(e, a) for e, a in zip(episodes, advantages)]
    training.forward_backward(data, 'importance_sampling'); training.optim_step(adam)
    sampler.client = training.save_weights_and_get_sampling_client().result()   # sample the new weights

The service only samples and trains; tool calls, env steps and token accounting stay in this process (as in the
tinker-cookbook). `tinker` is imported only when a sampler samples or a datum is built.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.types import IGNORE_INDEX, SampledSequence, SampleResponse, SamplingParams, StopReason

#: tinker stop reason -> twinkle's (`twinkle_core.types.StopReason`)
STOP_REASONS: dict[str, StopReason] = {'stop': 'stop', 'length': 'length'}
#: `SamplingParams` fields a tinker `SamplingClient.sample` call cannot express (with their unset values)
UNSUPPORTED: dict[str, Any] = {
    'prompt_top_logprobs': 0,
    'prompt_logprobs_last_n': None,
    'prompt_target_tokens': None,
    'prompt_alt_tokens': 0,
}


class TinkerSampler:
    """A twinkle sampler (``sample(prompts, sampling_params, adapter_name=None) -> list[SampleResponse]``) over a
    tinker `SamplingClient`: one request per prompt, all sent at once, then collected in order.

    Args:
        client: a ``tinker.SamplingClient`` (``training.save_weights_and_get_sampling_client()``, or
            ``service.create_sampling_client(model_path=...)``). Assign a new one to `client` after each
            optimizer step to sample the new weights.
        timeout_s: how long to wait for each request's result (None: no limit).

    With a ``seed``, prompt i of a call samples with ``seed + i``: repeated prompts (a GRPO group) differ, and a
    call is reproducible.
    """

    def __init__(self, client: Any, *, timeout_s: float | None = None) -> None:
        self.client, self.timeout_s = client, timeout_s

    def sample(
        self,
        prompts: Sequence[Mapping[str, Any] | Sequence[int]],
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> list[SampleResponse]:
        """One `SampleResponse` per prompt (``{'input_ids': [...]}`` or a list of token ids), in order."""
        import tinker

        if adapter_name:
            raise InvalidInputError(
                f'TinkerSampler samples the weights of its SamplingClient; adapter_name={adapter_name!r} cannot '
                'choose others. Make a SamplingClient for those weights (save_weights_and_get_sampling_client, '
                'or ServiceClient.create_sampling_client(model_path=...)) instead.'
            )
        params = check_params(sampling_params)
        ids = [prompt_ids(i, p) for i, p in enumerate(prompts)]
        futures = [
            self.client.sample(
                prompt=tinker.ModelInput.from_ints(tokens),
                num_samples=params.num_samples,
                sampling_params=tinker_params(params, i),
                include_prompt_logprobs=params.prompt_logprobs,
                topk_sample_logprobs=params.top_logprobs,
            )
            for i, tokens in enumerate(ids)
        ]
        return [to_response(f.result(timeout=self.timeout_s), params) for f in futures]


def check_params(sampling_params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    """`sampling_params` validated; an `InvalidInputError` for what a tinker request cannot carry."""
    params = SamplingParams.model_validate(dict(sampling_params or {}))
    for name, unset in UNSUPPORTED.items():
        if getattr(params, name) != unset:
            raise InvalidInputError(
                f'TinkerSampler does not support SamplingParams.{name}; call the tinker SamplingClient directly '
                'for prompt scoring.'
            )
    if not isinstance(params.logprobs, bool):
        raise InvalidInputError(
            f'TinkerSampler returns one log-prob per sampled token (logprobs=True), not the (token, log-prob) '
            f'pairs of logprobs={params.logprobs}; use top_logprobs={params.logprobs} for the most likely tokens.'
        )
    return params


def prompt_ids(index: int, prompt: Mapping[str, Any] | Sequence[int]) -> list[int]:
    """The token ids of one prompt: a row with ``input_ids`` or the ids themselves."""
    ids = prompt.get('input_ids') if isinstance(prompt, Mapping) else prompt
    if ids is None or isinstance(ids, str) or not all(isinstance(t, int) for t in ids):
        raise InvalidInputError(
            f'prompt {index}: TinkerSampler takes token ids ({{"input_ids": [...]}} or a list of ints); encode '
            'messages with the chat template first.'
        )
    if not ids:
        raise InvalidInputError(f'prompt {index} is empty.')
    return list(ids)


def tinker_params(params: SamplingParams, index: int) -> Any:
    """The `tinker.SamplingParams` of prompt `index` (``seed + index`` when seeded)."""
    import tinker

    return tinker.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        stop=params.stop,
        seed=None if params.seed is None else params.seed + index,
    )


def to_response(response: Any, params: SamplingParams) -> SampleResponse:
    """A tinker `SampleResponse` as twinkle's (log-probs only where `params` asked for them)."""
    sequences = []
    for seq in response.sequences:
        reason = STOP_REASONS.get(seq.stop_reason)
        if reason is None:
            raise TwinkleError(f'the service returned an unknown stop reason {seq.stop_reason!r}')
        logprobs = seq.logprobs
        if params.logprobs and (logprobs is None or len(logprobs) != len(seq.tokens)):
            raise TwinkleError('the service returned no log-prob for some sampled tokens; cannot train on them.')
        top = seq.topk_logprobs if params.top_logprobs else None
        sequences.append(
            SampledSequence(
                tokens=list(seq.tokens),
                logprobs=[float(lp) for lp in logprobs] if params.logprobs else None,
                stop_reason=reason,
                top_logprobs=[list(map(tuple, row or [])) for row in top] if top is not None else None,
            )
        )
    prompt_logprobs = response.prompt_logprobs if params.prompt_logprobs else None
    return SampleResponse(sequences=sequences, prompt_logprobs=prompt_logprobs)


def _shifted(row: Mapping[str, Any]) -> tuple[Any, list[int], list[bool]]:
    """(model input = ``input_ids[:-1]``, targets = ``input_ids[1:]``, whether each target is trained)."""
    import tinker

    ids, labels = list(row['input_ids']), list(row['labels'])
    if len(ids) != len(labels) or len(ids) < 2:
        raise InvalidInputError('a row needs input_ids and labels of the same length (at least 2 tokens).')
    return tinker.ModelInput.from_ints(ids[:-1]), ids[1:], [label != IGNORE_INDEX for label in labels[1:]]


def episode_datum(episode: Mapping[str, Any], advantage: float) -> Any:
    """A `MultiTurnRollout` episode as one ``tinker.Datum`` for the RL losses (``importance_sampling``, ``ppo``,
    ...), shifted as the tinker-cookbook's ``trajectory_to_data`` does: every sampled token is a target with its
    behaviour log-prob and `advantage`; prompt and inserted tokens have log-prob 0 and advantage 0."""
    import tinker

    model_input, targets, trained = _shifted(episode)
    behaviour = iter(episode['logprobs'])
    if sum(trained) != len(episode['logprobs']):
        raise InvalidInputError(
            f'the episode has {sum(trained)} trained tokens but {len(episode["logprobs"])} log-probs; sample with '
            'logprobs=True.'
        )
    inputs: dict[str, Any] = {  # lists: the Datum converts them to TensorData
        'target_tokens': targets,
        'logprobs': [float(next(behaviour)) if t else 0.0 for t in trained],
        'advantages': [float(advantage) if t else 0.0 for t in trained],
    }
    return tinker.Datum(model_input=model_input, loss_fn_inputs=inputs)


def sft_datum(row: Mapping[str, Any]) -> Any:
    """A row with ``input_ids`` and ``labels`` (e.g. ``Template.encode`` of a conversation) as one
    ``cross_entropy`` ``tinker.Datum``: weight 1 on the labelled tokens, 0 elsewhere."""
    import tinker

    model_input, targets, trained = _shifted(row)
    inputs: dict[str, Any] = {'target_tokens': targets, 'weights': [1.0 if t else 0.0 for t in trained]}
    return tinker.Datum(model_input=model_input, loss_fn_inputs=inputs)
