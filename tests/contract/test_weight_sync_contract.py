"""CheckpointEngineManager into every installed sampler (in process): after a sync the sampler's logprobs equal
the training model's -- base + LoRA first, LoRA only afterwards, and merged weights with merge_and_sync. The
shared vLLM engine is restored to the fixture's weights afterwards."""

from __future__ import annotations

import pytest
import torch

from tests.contract.implementations import build_sampler, installed, release, skip_unless_causal_lm
from tests.contract.test_sampler_contract import forward_logprobs
from twinkle_core.types import SamplingParams
from twinkle_core.weight_sync.manager import CheckpointEngineManager
from twinkle_transformers.export import ModuleWeights

PROMPTS = [[5, 6, 7, 8, 9], [100, 200, 300]]
TARGETS = ['q_proj', 'v_proj', 'up_proj']


@pytest.fixture(params=installed('sampler'))
def sampler(request, tiny_model_dir):
    return build_sampler(request, request.param, tiny_model_dir)


def lora_model(model_dir):
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
    )
    training_step(model, scale=20.0)
    return model.eval()


def training_step(model, scale: float = 1.5) -> None:
    """Stand-in for an optimizer step: change every LoRA tensor."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'lora_' in name:
                p.mul_(scale).add_(0.01)


def assert_sampler_matches(sampler, model, adapter_name=None, seed=0):
    responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, seed=seed), adapter_name=adapter_name)
    for prompt, response in zip(PROMPTS, responses):
        seq = response.sequences[0]
        ref = forward_logprobs(model, prompt + seq.tokens)[len(prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-4, rtol=0)


def restore_base(sampler, model_dir):
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    sampler.begin_weight_update()
    sampler.load_weights(original)
    sampler.end_weight_update()


def test_lora_sync_sends_base_once_then_the_adapter_only(sampler, tiny_model_dir):
    model = lora_model(tiny_model_dir)
    manager = CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler, sampler_adapter_name='policy')
    try:
        first = manager.sync_weights()
        assert first.moved and not first.lora_only and first.adapter_name == 'policy'
        assert_sampler_matches(sampler, model, 'policy')
        training_step(model)
        second = manager.sync_weights()
        assert second.lora_only and second.num_tensors == 2 * 4 * len(TARGETS)  # A and B per adapted layer
        assert_sampler_matches(sampler, model, 'policy', seed=1)
    finally:
        sampler.remove_adapter('policy')


def test_merge_and_sync_serves_the_merged_model_as_base(sampler, tiny_model_dir):
    model = lora_model(tiny_model_dir)
    try:
        report = CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler).sync_weights(merge_and_sync=True)
        assert report.merged and not report.lora_only
        assert_sampler_matches(sampler, model, None)
    finally:
        restore_base(sampler, tiny_model_dir)


@pytest.mark.parametrize('backend', installed('model'))
def test_every_installed_backend_syncs_into_the_sampler(sampler, tiny_model_dir, backend):
    """A real training model of each installed backend (two AdamW steps, then a third after the first sync):
    the sampler's logprobs equal the model's own `forward_only` after each sync (1e-4)."""
    from twinkle_core.registry import resolve

    skip_unless_causal_lm(backend)

    rows = [{'input_ids': [5, 6, 7, 8, 9, 10], 'labels': [-100, -100, 7, 8, 9, 10]}]
    model = resolve('model', backend, model_id=str(tiny_model_dir), device='cpu')
    model.add_adapter_to_model('policy', {'r': 4, 'lora_alpha': 8, 'target_modules': TARGETS})
    model.set_optimizer('AdamW', lr=2e-2, adapter_name='policy')

    def train_step():
        model.forward_backward(inputs=rows, adapter_name='policy')
        model.clip_grad_and_step(adapter_name='policy')

    def assert_sampler_matches_model(seed):
        responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, seed=seed), adapter_name='synced')
        full = [{'input_ids': p + r.sequences[0].tokens} for p, r in zip(PROMPTS, responses)]
        reference = model.forward_only(inputs=full, compute_loss=False, adapter_name='policy')['logprobs']
        for prompt, response, ref in zip(PROMPTS, responses, reference):
            torch.testing.assert_close(
                torch.tensor(response.sequences[0].logprobs), torch.tensor(ref[len(prompt) :]), atol=1e-4, rtol=0
            )

    manager = CheckpointEngineManager(
        model=model, sampler=sampler, adapter_name='policy', sampler_adapter_name='synced'
    )
    try:
        train_step(), train_step()
        manager.sync_weights()
        assert_sampler_matches_model(seed=0)
        train_step()
        assert manager.sync_weights().lora_only
        assert_sampler_matches_model(seed=1)
    finally:
        sampler.remove_adapter('synced')
        release(model)
