"""The evaluation harness through the service, driven by the unmodified `tinker` SDK: `evaluate` over a
`SamplingClient` (`TinkerSampler`, prompts encoded and completions decoded client-side with the model's template)
scores exactly what a local `TorchSampler` on the same weights answers, greedily."""

from __future__ import annotations

from server_names import MODEL

from twinkle_agentic.rollout import TinkerSampler
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
