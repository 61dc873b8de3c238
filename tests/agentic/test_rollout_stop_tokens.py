"""A turn that ends at a stop token other than end-of-turn: the rollout closes it exactly as the chat template
renders it (the sampled turn is located by position, not by searching its text, which a one-token turn such as
``n`` or a newline also matches inside the template's closing ``<|im_end|>\\n``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from twinkle_agentic.envs.guess_number import GuessNumberEnv
from twinkle_agentic.rollout import MultiTurnRollout
from twinkle_agentic.rollout.bridge import TurnBridge
from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX, SampledSequence, SampleResponse, SamplingParams


class OneTokenSampler:
    """Every turn is the single token `token_id`, ended by the stop id (``stop_reason='stop'``), as TorchSampler
    returns it for ``stop=[token_id]`` (the stopping token included)."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def sample(self, prompts: list[dict[str, Any]], params: SamplingParams, **kwargs: Any) -> list[SampleResponse]:
        assert params.stop_token_ids() == [self.token_id]
        seq = SampledSequence(tokens=[self.token_id], logprobs=[-1.0], stop_reason='stop')
        return [SampleResponse(sequences=[seq]) for _ in prompts]


@pytest.mark.parametrize('text', ['n', '\n', '>', 'im', '<'])
def test_a_turn_ended_by_a_stop_token_is_closed_as_the_template_renders_it(template, text):
    tokenizer = template.tokenizer
    (token_id,) = tokenizer(text, add_special_tokens=False)['input_ids']
    rollout = MultiTurnRollout(
        OneTokenSampler(token_id),
        template,
        env=GuessNumberEnv,
        env_kwargs={'tool': False},
        max_turns=2,
        sampling_params={'max_tokens': 4, 'stop': [token_id]},
    )
    (episode,) = rollout([{'messages': [{'role': 'user', 'content': 'Guess my number.'}], 'user_data': {'secret': 7}}])
    ids, labels = episode['input_ids'], episode['labels']
    sampled = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    assert [ids[i] for i in sampled] == [token_id, token_id]
    user, observation = episode['messages'][0], episode['messages'][2]
    assert episode['messages'][1] == {'role': 'assistant', 'content': text} and observation['role'] == 'user'
    # between the two sampled tokens: the first turn's closing, the env's answer, the next generation prompt
    head = template.tokenizer.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
    whole = template.tokenizer.apply_chat_template(
        [user, {'role': 'assistant', 'content': text}, observation], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(ids[sampled[0] + 1 : sampled[1]]) == whole[len(head) + len(text) :]
    assert tokenizer.decode(ids[: sampled[1]]) == whole  # the context the template produces, token for token


def test_a_template_that_rewrites_the_sampled_turn_is_refused(template):
    tokenizer = copy.deepcopy(template.tokenizer)
    tokenizer.chat_template = (
        '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}'
        '{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
    )
    bridge = TurnBridge(tokenizer)
    messages = [{'role': 'user', 'content': 'Guess.'}, {'role': 'assistant', 'content': ' 5 '}]
    with pytest.raises(InvalidInputError, match='does not render the sampled turn'):
        bridge.tokens(messages, [{'role': 'user', 'content': 'too low'}], None, ' 5 ')
    assert bridge.tokens(messages[:1] + [{'role': 'assistant', 'content': '5'}], [], None, '5')  # verbatim: fine
