"""GRPO with separate model and sampler groups syncs weights through the CheckpointEngine; a reward model and a
critic in Ray groups score and train like local ones. (A 2-actor model group: test_ray_model_group.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import twinkle_core
from twinkle_core.mesh import DeviceGroup

pytest.importorskip('ray')

EXAMPLES = Path(__file__).resolve().parents[2] / 'examples'


@pytest.mark.slow
@pytest.mark.parametrize(
    'sampler_name, model_mesh, sampler_ranks',
    [
        # a DDP model group with TorchSampler is the cross of these two: DDP's export (vLLM below) and TorchSampler
        # receiving (FSDP2 here)
        ('TorchSampler', 'fsdp', 1),  # every model rank exports (gathering FSDP2 shards); rank 0 sends
        # two vLLM engines (one per sampler rank, prompts split between them), each fed by the broadcast
        pytest.param(
            'vLLMSampler',
            'dp',
            2,
            marks=pytest.mark.skipif(importlib.util.find_spec('vllm') is None, reason='vllm is not installed'),
        ),
    ],
)
def test_grpo_with_separate_model_and_sampler_groups_syncs_weights(
    ray_cluster, sampler_name, model_mesh, sampler_ranks
) -> None:
    spec = importlib.util.spec_from_file_location('ray_grpo_example', EXAMPLES / 'ray_grpo.py')
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(
        steps=2,
        prompts_per_step=2,
        group_size=4,
        sampler_name=sampler_name,
        model_mesh=model_mesh,
        sampler_ranks=sampler_ranks,
    )
    assert len(result['losses']) == 2 and len(result['syncs']) == 3
    first, later = result['syncs'][0], result['syncs'][-1]
    assert first['moved'] and not first['lora_only']  # base + adapter the first time
    assert later['moved'] and later['lora_only'] and later['num_tensors'] < first['num_tensors']
    assert result['max_logprob_moved'] > 1e-3  # training changed the policy the sampler runs ...
    assert result['max_logprob_diff'] < 1e-4  # ... and after the sync the sampler scores exactly like the model


@pytest.mark.slow
def test_a_reward_model_and_a_critic_in_ray_groups_score_and_train_like_local_ones(ray_cluster, tiny_model_dir) -> None:
    """`RewardModelReward` over a reward model hosted in a Ray group scores like the same model in this process,
    and a critic in a group takes the same `PPOValueLoss` steps (same head: `head_init='normal'`, seed 0)."""
    from twinkle_core.registry import resolve
    from twinkle_transformers.value_model import TransformersValueModel

    template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir))
    trajectories = [
        {'messages': [{'role': 'user', 'content': f'repeat {d}'}, {'role': 'assistant', 'content': str(a)}]}
        for d, a in [(1, 1), (2, 5), (7, 7), (3, 0)]
    ]
    rows = [
        {**row, 'returns': [float(i % 3 == 0) for i in range(len(row['input_ids']))]}
        for row in (template.encode(t) for t in trajectories)
    ]

    def run(rm_group: dict, critic_group: dict) -> tuple[list[float], list[float]]:
        reward_model = TransformersValueModel(tiny_model_dir, head_init='normal', **rm_group)
        scores = resolve('reward', 'RewardModelReward', model=reward_model, template=template, batch_size=3)(
            trajectories
        )
        critic = TransformersValueModel(tiny_model_dir, head_init='normal', **critic_group)
        critic.set_loss('PPOValueLoss', clip_range=None)
        critic.set_optimizer('AdamW', lr=1e-4)
        losses = []
        for _ in range(3):
            losses.append(critic.forward_backward(inputs=rows)['loss'])
            critic.clip_grad_and_step(max_norm=1.0)
        return scores, losses

    local_scores, local_losses = run({}, {})
    twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='rm', ranks=1), DeviceGroup(name='critic', ranks=1)])
    try:
        remote_scores, remote_losses = run({'remote_group': 'rm'}, {'remote_group': 'critic'})
    finally:
        twinkle_core.shutdown()
    assert len(set(local_scores)) == 4  # a random head: four different scores
    assert remote_scores == pytest.approx(local_scores, abs=1e-5)
    assert remote_losses == pytest.approx(local_losses, abs=1e-5) and local_losses[-1] < local_losses[0], local_losses
