"""A scripted policy for rollout tests: a function of the conversation text chooses each reply, and the reply's
tokens get the real tiny model's log-probs (teacher-forced through `TorchSampler`'s prompt log-probs), so episode
log-probs can be checked against the training model. The random-weight fixture cannot be asked to call tools;
this stands in for the model's choices only -- tokens, log-probs, templates and tools are all real."""

from __future__ import annotations

from typing import Any, Callable

from twinkle_core.types import IGNORE_INDEX, SampledSequence, SampleResponse, SamplingParams


class ScriptedSampler:
    """`sample(prompts, params)` -> per prompt the reply ``policy(prompt_text)`` as tokens (+ EOS unless the reply
    is cut by ``max_tokens``: stop reason ``length``), with the model's log-prob of each token. Records every call's
    batch size in `calls`."""

    def __init__(self, sampler: Any, tokenizer: Any, policy: Callable[[str], str]) -> None:
        self.sampler, self.tokenizer, self.policy = sampler, tokenizer, policy
        self.calls: list[int] = []

    def sample(self, prompts: list[dict[str, Any]], params: SamplingParams, **kwargs: Any) -> list[SampleResponse]:
        self.calls.append(len(prompts))
        out = []
        for prompt in prompts:
            ids = list(prompt['input_ids'])
            reply = self.tokenizer(self.policy(self.tokenizer.decode(ids)), add_special_tokens=False)['input_ids']
            tokens = (reply + [self.tokenizer.eos_token_id])[: params.max_tokens]
            stop = 'stop' if len(tokens) == len(reply) + 1 else 'length'
            scored = self.sampler.sample([{'input_ids': ids + tokens}], {'max_tokens': 1, 'prompt_logprobs': True})
            logprobs = [float(x) for x in scored[0].prompt_logprobs[len(ids) :]]
            out.append(SampleResponse(sequences=[SampledSequence(tokens=tokens, logprobs=logprobs, stop_reason=stop)]))
        return out


def trainable_runs(row: dict[str, Any]) -> list[list[int]]:
    """The runs of trainable tokens (label == token, checked) of a row, in order: its sampled turns."""
    runs: list[list[int]] = []
    current: list[int] = []
    for token, label in zip(row['input_ids'], row['labels']):
        if label == IGNORE_INDEX:
            if current:
                runs.append(current)
            current = []
        else:
            assert label == token
            current.append(token)
    return runs + ([current] if current else [])
