"""GRPO on Ray: the policy trains in one device group, the sampler generates in another, and the weights move
between them through the CheckpointEngine (torch.distributed broadcast; gloo on CPU, NCCL on GPUs).

    python examples/ray_grpo.py                          # local Ray on this machine: 2 model actors + 1 sampler
    python examples/ray_grpo.py --address auto           # an existing cluster
    python examples/ray_grpo.py --device-type cuda       # one GPU per rank
    python examples/ray_grpo.py --sampler vLLMSampler    # vLLM engines in the sampler group (pip install twinkle-vllm)
    python examples/ray_grpo.py --model-mesh fsdp        # the policy sharded with FSDP2 across the model ranks

Each step: sync weights (every model rank exports, gathering shards; rank 0 sends to every sampler rank; LoRA only
after the first sync) -> sample
``group_size`` completions per prompt -> reward -> group-relative advantages -> one GRPO step, the rows split
across the data-parallel model actors. The task is deliberately trivial (reward = share of even token ids in the
completion) so that rewards vary from the first step on the random-weight fixture model; examples/grpo.py learns
a real task. At the end, fixed probe sequences are scored by the sampler (prompt log-probs) and by the model:
after the last sync they agree, and they differ from the sampler's scores before training (the weights moved).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import asdict
from statistics import fmean
from typing import Any

from tqdm import tqdm

import twinkle_core
from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.checkpoint_engine import CheckpointEngineManager
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.types import SamplingParams

ADAPTER = 'default'


def addition_prompts(rng: random.Random, n: int) -> list[dict[str, Any]]:
    pairs = [(rng.randint(0, 4), rng.randint(0, 4)) for _ in range(n)]
    return [{'messages': [{'role': 'user', 'content': f'{a}+{b}='}], 'ground_truth': str(a + b)} for a, b in pairs]


def even_token_reward(rows: list[dict[str, Any]], prompt_lengths: list[int]) -> list[float]:
    """Share of completion tokens with an even id (a toy objective every policy gets a varied signal from)."""
    out = []
    for row, n in zip(rows, prompt_lengths):
        completion = row['input_ids'][n:]
        out.append(sum(t % 2 == 0 for t in completion) / max(1, len(completion)))
    return out


def sampler_scores(sampler: Any, rows: list[dict[str, Any]]) -> list[list[float]]:
    """The sampler's log-probs of each row's own tokens (prompt log-probs; element 0 is 0.0 as in the model's)."""
    responses = sampler.sample(
        [{'input_ids': r['input_ids']} for r in rows],
        SamplingParams(max_tokens=1, prompt_logprobs=True),
        adapter_name=ADAPTER,
    )
    return [[0.0, *r.prompt_logprobs[1:]] for r in responses]


def rollout(
    sampler: Any, template: Any, prompts: list[dict[str, Any]], params: SamplingParams
) -> tuple[list[dict[str, Any]], list[int]]:
    """Sample; return (training rows with old_logps, prompt length per row)."""
    prompt_rows = [template.encode(p, add_generation_prompt=True) for p in prompts]
    responses = sampler.sample(prompt_rows, params, adapter_name=ADAPTER)
    rows, prompt_lengths = [], []
    for prompt_row, response in zip(prompt_rows, responses):
        ids = prompt_row['input_ids']
        for seq in response.sequences:
            rows.append(
                {
                    'input_ids': ids + seq.tokens,
                    'labels': [-100] * len(ids) + seq.tokens,
                    'old_logps': [0.0] * len(ids) + seq.logprobs,
                }
            )
            prompt_lengths.append(len(ids))
    return rows, prompt_lengths


def main(
    steps: int = 4,
    prompts_per_step: int = 4,
    group_size: int = 4,
    model_ranks: int = 2,
    sampler_ranks: int = 1,
    device_type: str = 'cpu',
    address: str | None = None,
    seed: int = 0,
    lr: float = 1e-3,
    sampler_name: str = 'TorchSampler',
    model_mesh: str = 'dp',
) -> dict[str, Any]:
    twinkle_core.initialize(
        mode='ray',
        address=address,
        groups=[
            DeviceGroup(name='model', ranks=model_ranks, device_type=device_type),
            DeviceGroup(name='sampler', ranks=sampler_ranks, device_type=device_type),
        ],
    )
    rng = random.Random(seed)
    model_dir = str(ensure_tiny_model('tiny'))
    mesh = DeviceMesh.from_sizes(**{f'{model_mesh}_size': model_ranks}, device_type=device_type)
    model = TransformersModel(model_id=model_dir, remote_group='model', device_mesh=mesh)
    model.add_adapter_to_model(ADAPTER, {'r': 8, 'lora_alpha': 32, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=lr)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28, loss_type='grpo')
    sampler_args = {'engine_args': {'max_model_len': 256, 'max_lora_rank': 8}} if sampler_name == 'vLLMSampler' else {}
    sampler = resolve_class('sampler', sampler_name)(model_id=model_dir, remote_group='sampler', **sampler_args)
    sync = CheckpointEngineManager(model=model, sampler=sampler)  # model and sampler in two Ray groups
    template = resolve('template', 'Template', model_id_or_tokenizer=model_dir)
    advantage_fn = GRPOAdvantage(scale='group')
    probes = [
        {'input_ids': template.encode(p, add_generation_prompt=True)['input_ids'] + [10 + i, 20 + i, 30 + i]}
        for i, p in enumerate(addition_prompts(random.Random(seed + 1), 2))
    ]

    losses, rewards_per_step, syncs = [], [], []
    for step in tqdm(range(steps), desc='GRPO on Ray'):
        syncs.append(asdict(sync.sync_weights()))
        if step == 0:
            probe_scores_before = sampler_scores(sampler, probes)
        params = SamplingParams(max_tokens=4, temperature=1.0, num_samples=group_size, seed=seed * 1000 + step)
        rows, prompt_lengths = rollout(sampler, template, addition_prompts(rng, prompts_per_step), params)
        rewards = even_token_reward(rows, prompt_lengths)
        for row, advantage in zip(rows, advantage_fn(rewards, group_size=group_size)):
            row['advantage'] = advantage
        losses.append(model.forward_backward(inputs=rows)['loss'])
        model.clip_grad_and_step(max_norm=1.0)
        rewards_per_step.append(fmean(rewards))

    # After a sync the sampler runs exactly the trained policy: its log-probs equal the model's.
    syncs.append(asdict(sync.sync_weights()))
    after = sampler_scores(sampler, probes)
    model_scores = model.forward_only(inputs=probes, compute_loss=False)['logprobs']
    max_diff = max(abs(m - s) for mr, sr in zip(model_scores, after) for m, s in zip(mr[1:], sr[1:]))
    moved = max(abs(a - b) for ar, br in zip(after, probe_scores_before) for a, b in zip(ar[1:], br[1:]))
    print(
        f'steps: {steps}; loss per step: {[round(x, 4) for x in losses]}; mean reward per step: '
        f'{[round(r, 3) for r in rewards_per_step]}'
    )
    print(
        f'weight syncs: {len(syncs)} (first: {syncs[0]["num_tensors"]} tensors, lora_only={syncs[0]["lora_only"]};'
        f' then lora_only={syncs[-1]["lora_only"]}). Probe log-probs: sampler vs model after the last sync differ '
        f'by at most {max_diff:.2e}; training moved them by up to {moved:.2e}.'
    )
    sync.close()
    twinkle_core.shutdown()
    return {
        'losses': losses,
        'rewards': rewards_per_step,
        'syncs': syncs,
        'max_logprob_diff': max_diff,
        'max_logprob_moved': moved,
    }


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--group-size', type=int, default=4)
    parser.add_argument('--model-ranks', type=int, default=2)
    parser.add_argument('--sampler-ranks', type=int, default=1)
    parser.add_argument('--device-type', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--address', default=None, help="Ray cluster address ('auto', 'ray://host:10001')")
    parser.add_argument('--sampler', default='TorchSampler', help='sampler by registry name, e.g. vLLMSampler')
    parser.add_argument(
        '--model-mesh',
        default='dp',
        choices=['dp', 'fsdp'],
        help='how the model ranks share the policy: DDP replicas or FSDP2 shards',
    )
    args = parser.parse_args()
    main(
        steps=args.steps,
        group_size=args.group_size,
        model_ranks=args.model_ranks,
        sampler_ranks=args.sampler_ranks,
        device_type=args.device_type,
        address=args.address,
        sampler_name=args.sampler,
        model_mesh=args.model_mesh,
    )
