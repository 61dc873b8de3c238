"""CheckpointEngineManager + engines with real models: after a sync the sampler's logprobs equal the training
model's; LoRA-only after the first sync; nothing moves when the sampler shares the adapter; merge_and_sync."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import SamplingParams
from twinkle_core.weight_sync.manager import CheckpointEngineManager
from twinkle_transformers.export import ModuleWeights

PROMPTS = [[5, 6, 7, 8, 9], [100, 200, 300]]
TARGETS = ['q_proj', 'v_proj', 'up_proj']


def lora_model(model_dir, seed: int = 0):
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
    )
    training_step(model, scale=20.0)
    return model


def training_step(model, scale: float = 1.5, adapter: str = 'default') -> None:
    """Stand-in for an optimizer step: change every LoRA tensor of `adapter`."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'lora_' in name and f'.{adapter}.' in name:
                p.mul_(scale).add_(0.01)


def forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def assert_sampler_matches(sampler, model, adapter_name=None, seed=0):
    was_training = model.training
    model.eval()
    responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, seed=seed), adapter_name=adapter_name)
    for prompt, response in zip(PROMPTS, responses):
        seq = response.sequences[0]
        ref = forward_logprobs(model, prompt + seq.tokens)[len(prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-4, rtol=0)
    model.train(was_training)


def test_in_process_sync_sends_base_once_then_lora_only(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    model = lora_model(tiny_model_dir)
    sampler = TorchSampler(tiny_model_dir, device='cpu')
    manager = CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler)
    first = manager.sync_weights()
    assert first.moved and not first.lora_only and first.adapter_name == 'default'
    assert_sampler_matches(sampler, model, 'default')
    training_step(model)
    second = manager.sync_weights()
    assert second.lora_only and second.num_tensors == 2 * 4 * len(TARGETS)  # A and B per targeted layer
    assert second.num_bytes < first.num_bytes / 10
    assert_sampler_matches(sampler, model, 'default', seed=1)


def test_shared_model_moves_nothing_and_shared_base_moves_lora_only(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    model = lora_model(tiny_model_dir)
    sampler = TorchSampler(model=model)
    assert CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler).sync_weights().moved is False
    renamed = CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler, sampler_adapter_name='policy_v1')
    report = renamed.sync_weights()
    assert report.moved and report.lora_only and report.adapter_name == 'policy_v1'
    assert_sampler_matches(sampler, model, 'policy_v1')
    training_step(model)  # the live adapter moves on; the synced snapshot does not
    assert_sampler_matches(sampler, model, 'default')
    with pytest.raises(AssertionError):
        assert_sampler_matches(sampler, model, 'policy_v1')


def test_merge_and_sync_puts_merged_weights_in_the_base(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    model = lora_model(tiny_model_dir)
    sampler = TorchSampler(tiny_model_dir, device='cpu')
    manager = CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler)
    report = manager.sync_weights(merge_and_sync=True)
    assert report.merged and not report.lora_only and sampler.adapter_names == []
    assert_sampler_matches(sampler, model, adapter_name=None)  # base rows now carry the merged adapter
    # After a merged sync the next plain sync must restore the pristine base, not stack LoRA on merged weights.
    plain = manager.sync_weights()
    assert not plain.lora_only
    assert_sampler_matches(sampler, model, 'default', seed=2)
    shared = CheckpointEngineManager(model=ModuleWeights(model), sampler=TorchSampler(model=model))
    with pytest.raises(InvalidInputError, match='own copy'):
        shared.sync_weights(merge_and_sync=True)


def test_full_parameter_sync(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from twinkle_transformers.sampler import TorchSampler

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sampler = TorchSampler(tiny_model_dir, device='cpu')
    report = CheckpointEngineManager(model=ModuleWeights(model), sampler=sampler).sync_weights()
    assert report.moved and report.adapter_name is None
    assert_sampler_matches(sampler, model)


def test_sync_from_transformers_model_matches_forward_only(tiny_model_dir):
    """The training model's own logprobs (TransformersModel.forward_only) equal the sampler's after a sync."""
    from twinkle_transformers.model import TransformersModel
    from twinkle_transformers.sampler import TorchSampler

    trainer = TransformersModel(tiny_model_dir, device='cpu', dtype='float32')
    trainer.add_adapter_to_model(
        'default', {'r': 4, 'lora_alpha': 8, 'target_modules': TARGETS, 'init_lora_weights': False}
    )
    training_step(trainer.model, scale=10.0)
    sampler = TorchSampler(tiny_model_dir, device='cpu')
    CheckpointEngineManager(model=trainer, sampler=sampler).sync_weights()
    responses = sampler.sample(PROMPTS, max_tokens=6, seed=3, adapter_name='default')
    rows = [
        {'input_ids': p + r.sequences[0].tokens, 'labels': [-100] * len(p) + r.sequences[0].tokens}
        for p, r in zip(PROMPTS, responses)
    ]
    out = trainer.forward_only(inputs=rows)
    for prompt, response, logprobs in zip(PROMPTS, responses, out['logprobs']):
        torch.testing.assert_close(
            torch.tensor(logprobs[len(prompt) :]), torch.tensor(response.sequences[0].logprobs), atol=1e-4, rtol=0
        )


def test_multi_lora_model_syncs_each_tenant_and_shared_sampler_uses_it_directly(tiny_model_dir):
    """A MultiLoraTransformersModel's tenants sync into a separate sampler (LoRA tensors in PEFT format), and a
    sampler sharing the model samples each tenant without any copy; logprobs equal forward_only's."""
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel
    from twinkle_transformers.sampler import TorchSampler

    trainer = MultiLoraTransformersModel(tiny_model_dir, device='cpu', dtype='float32')
    for i, name in enumerate(('tenant_a', 'tenant_b')):
        trainer.add_adapter_to_model(
            name,
            {'r': 2 + 2 * i, 'lora_alpha': 8, 'target_modules': TARGETS, 'init_lora_weights': False},
            generator=torch.Generator().manual_seed(i),
        )
    separate = TorchSampler(tiny_model_dir, device='cpu')
    shared = TorchSampler(model=trainer)
    for name in ('tenant_a', 'tenant_b'):
        assert CheckpointEngineManager(model=trainer, sampler=separate, adapter_name=name).sync_weights().moved
        assert not CheckpointEngineManager(model=trainer, sampler=shared, adapter_name=name).sync_weights().moved
    for sampler in (separate, shared):
        names = ['tenant_a', 'tenant_b']
        responses = sampler.sample(PROMPTS, max_tokens=6, seed=4, adapter_name=names)
        for prompt, response, name in zip(PROMPTS, responses, names):
            tokens = response.sequences[0].tokens
            out = trainer.forward_only(
                inputs=[{'input_ids': prompt + tokens, 'labels': [-100] * len(prompt) + tokens}], adapter_name=name
            )
            torch.testing.assert_close(
                torch.tensor(out['logprobs'][0][len(prompt) :]),
                torch.tensor(response.sequences[0].logprobs),
                atol=1e-4,
                rtol=0,
            )
