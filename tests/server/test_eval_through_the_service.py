"""The evaluation harness through the service, driven by the unmodified `tinker` SDK (`evaluate` over a
`SamplingClient`: `TinkerSampler`, prompts encoded and completions decoded client-side with the model's template) and
by the `openai` client on `/v1` (`OpenAISampler`: the endpoint renders and decodes): each scores exactly what a local
`TorchSampler` on the same weights answers, greedily."""

from __future__ import annotations

import pytest
from server_names import MODEL

from twinkle_agentic.rollout import OpenAISampler, TinkerSampler
from twinkle_core.errors import InvalidInputError
from twinkle_core.eval import evaluate
from twinkle_core.eval.arithmetic import ArithmeticTask
from twinkle_core.registry import resolve


def test_evaluation_through_the_tinker_sdk_equals_a_local_sampler(service_client, tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    task = ArithmeticTask(size=6, max_tokens=5)
    template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir))
    remote = TinkerSampler(service_client.create_sampling_client(base_model=MODEL).result(), timeout_s=120)
    through_service = evaluate(remote, task, template=template, progress=False)
    local = evaluate(TorchSampler(tiny_model_dir, device='cpu'), task, progress=False)
    assert [r['completions'] for r in through_service.records] == [r['completions'] for r in local.records]
    assert all(c for r in local.records for c in r['completions'])  # something was answered, and compared
    assert through_service.metrics == local.metrics


def test_evaluation_through_the_openai_endpoint_equals_a_local_sampler(client, tiny_model_dir):
    """The `openai` client on `/v1` (`OpenAISampler`: the endpoint renders the chat and decodes): the same greedy
    completions and metrics as a local `TorchSampler`, lengths counted from the endpoint's per-token log-probs."""
    from twinkle_transformers.sampler import TorchSampler

    task = ArithmeticTask(size=6, max_tokens=5)
    remote = OpenAISampler(client, model=MODEL, concurrency=3)
    through_endpoint = evaluate(remote, task, progress=False)
    local = evaluate(TorchSampler(tiny_model_dir, device='cpu'), task, progress=False)
    assert [r['completions'] for r in through_endpoint.records] == [r['completions'] for r in local.records]
    assert all(c for r in local.records for c in r['completions'])
    assert through_endpoint.metrics == local.metrics  # mean_length included: the endpoint's token counts


def test_the_openai_sampler_refuses_what_an_endpoint_cannot_take(client):
    sampler = OpenAISampler(client, model=MODEL)
    with pytest.raises(InvalidInputError, match='takes chat prompts'):
        sampler.sample([{'input_ids': [1, 2, 3]}])
    with pytest.raises(InvalidInputError, match='prompt_logprobs'):
        sampler.sample([{'messages': [{'role': 'user', 'content': 'hi'}]}], {'prompt_logprobs': True})
