"""`TinkerSampler` against a fake tinker `SamplingClient` (no service): requests sent at once, then collected in
order; seeds, stop reasons and log-probs mapped; what a tinker request cannot carry refused before sending. The
real service is in tests/server/test_agentic_tinker.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from twinkle_agentic.rollout import TinkerSampler, episode_datum
from twinkle_core.errors import InvalidInputError, TwinkleError


class FakeFuture:
    """A request's future: records how many requests had been sent when its result was first asked for."""

    def __init__(self, client: FakeClient, response: Any) -> None:
        self.client, self.response = client, response

    def result(self, timeout: float | None = None) -> Any:
        self.client.sent_before_result.append(len(self.client.requests))
        return self.response


class FakeClient:
    """Answers each prompt with its own last token (log-prob -0.5)."""

    def __init__(self, stop_reason: str = 'stop') -> None:
        self.requests: list[dict[str, Any]] = []
        self.sent_before_result: list[int] = []
        self.stop_reason = stop_reason

    def sample(self, *, prompt, num_samples, sampling_params, **kwargs):
        self.requests.append({'prompt': prompt.to_ints(), 'params': sampling_params, **kwargs})
        seq = SimpleNamespace(
            tokens=[prompt.to_ints()[-1]], logprobs=[-0.5], stop_reason=self.stop_reason, topk_logprobs=None
        )
        return FakeFuture(self, SimpleNamespace(sequences=[seq] * num_samples, prompt_logprobs=None))


def test_requests_go_out_together_and_come_back_in_order():
    client = FakeClient()
    out = TinkerSampler(client).sample([{'input_ids': [1, 7]}, [2, 9], {'input_ids': [3]}], {'seed': 5, 'stop': [4]})
    assert client.sent_before_result == [3, 3, 3]  # every request was sent before any result was awaited
    assert [r.sequences[0].tokens for r in out] == [[7], [9], [3]]
    assert [r.sequences[0].logprobs for r in out] == [[-0.5]] * 3
    assert [r.sequences[0].stop_reason for r in out] == ['stop'] * 3
    assert [r['params'].seed for r in client.requests] == [5, 6, 7]  # a group's repeated prompts differ
    assert client.requests[0]['params'].stop == [4]


def test_an_unknown_stop_reason_is_an_error():
    with pytest.raises(TwinkleError, match='unknown stop reason'):
        TinkerSampler(FakeClient('abort')).sample([[1]], {})


def test_unsupported_requests_are_refused_before_sending():
    client = FakeClient()
    sampler = TinkerSampler(client)
    with pytest.raises(InvalidInputError, match='adapter_name'):
        sampler.sample([[1, 2]], {}, adapter_name='other')
    with pytest.raises(InvalidInputError, match='prompt_alt_tokens'):
        sampler.sample([[1, 2]], {'prompt_alt_tokens': 2})
    with pytest.raises(InvalidInputError, match='top_logprobs=1'):
        sampler.sample([[1, 2]], {'logprobs': 1})
    with pytest.raises(InvalidInputError, match='token ids'):
        sampler.sample([{'messages': []}], {})
    assert client.requests == []


def test_episode_datum_trains_only_sampled_tokens():
    episode = {'input_ids': [1, 2, 3, 4, 5], 'labels': [-100, -100, 3, -100, 5], 'logprobs': [-0.1, -0.2]}
    datum = episode_datum(episode, 2.0)
    assert datum.model_input.to_ints() == [1, 2, 3, 4]
    inputs = {k: v.tolist() for k, v in datum.loss_fn_inputs.items()}
    assert inputs['target_tokens'] == [2, 3, 4, 5]
    assert inputs['logprobs'] == pytest.approx([0.0, -0.1, 0.0, -0.2])
    assert inputs['advantages'] == [0.0, 2.0, 0.0, 2.0]
    with pytest.raises(InvalidInputError, match='log-probs'):
        episode_datum({**episode, 'logprobs': [-0.1]}, 1.0)
