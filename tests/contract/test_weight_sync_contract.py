"""CheckpointEngineManager into every installed sampler (in process): after a sync the sampler's logprobs equal
the training model's -- base + LoRA first, LoRA only afterwards, and merged weights with merge_and_sync. The
shared vLLM engine is restored to the fixture's weights afterwards."""
from __future__ import annotations

import pytest
import torch

from twinkle_core.checkpoint_engine.manager import CheckpointEngineManager
from twinkle_core.types import SamplingParams
from twinkle_transformers.export import ModuleWeights

from tests.contract.test_sampler_contract import forward_logprobs

PROMPTS = [[5, 6, 7, 8, 9], [100, 200, 300]]
TARGETS = ['q_proj', 'v_proj', 'up_proj']


@pytest.fixture(params=['TorchSampler', 'vLLMSampler'])
def sampler(request, tiny_model_dir):
    if request.param == 'vLLMSampler':
        return request.getfixturevalue('vllm_sampler')
    from twinkle_core.registry import resolve
    return resolve('sampler', 'TorchSampler', model_id=tiny_model_dir, device='cpu')


def lora_model(model_dir):
    import peft
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS,
                                                      init_lora_weights=False))
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
        ref = forward_logprobs(model, prompt + seq.tokens)[len(prompt) - 1:]
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
