"""PPO with a critic on CPU with the tiny fixture model: "repeat 7" -> "7" (echo the prompt's digit), reward 0/1.

The loop is the whole algorithm, top to bottom (as in TRL's and OpenRLHF's PPO):

1. sample completions of the policy (`TorchSampler` sharing its weights);
2. score them (the task's reward, credited at the last token), and -- with ``--kl-coef`` -- subtract a per-token
   KL(policy || reference) estimate from the reward (``--kl-estimator`` k1/k2/k3; the reference is the policy
   after the warm-start, a frozen copy);
3. the critic (`TransformersValueModel`: the same base with a scalar head) gives the value of the state before
   every completion token; `GAEAdvantage` turns rewards and values into per-token advantages and returns;
4. one clipped-surrogate step of the policy on the per-token ``advantages`` (`GRPOLoss` with ``loss_type='bnpo'``:
   PPO's token-mean objective) and one `PPOValueLoss` step of the critic on the ``returns``.

A short SFT warm-start first teaches the answer *format* only (one digit, end of turn: random digits, unrelated
to the prompt), so about 10 % of sampled answers are right at the start. Watch the reward rise and the critic's
explained variance climb from about 0 as it learns which answers earn the reward.

    python examples/ppo.py                       # ~2 minutes on one CPU core
    python examples/ppo.py --kl-coef 0.05        # with a KL penalty to the warm-started policy in the reward
    torchrun --nproc_per_node 2 examples/ppo.py --runtime torchrun   # policy and critic data-parallel (DDP)
    python examples/ppo.py --runtime ray --ranks 2                   # policy, critic, sampler: three Ray groups

The loop is the same in every runtime; what differs is where the models live (`init_runtime`, `placement`).
Under torchrun every rank samples its own prompts with the sampler sharing its policy replica, and the models
average gradients over the ranks; on Ray the policy and the critic are each a group of ``--ranks`` data-parallel
actors that split the rows between them, the sampler is a third group and gets the policy's weights before each
rollout (`CheckpointEngineManager`), and the KL reference (``--kl-coef``) is a fourth.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
from statistics import fmean
from typing import Any

from tqdm import tqdm

import twinkle_core
from twinkle_core.advantage import GAEAdvantage
from twinkle_core.checkpoint_engine import CheckpointEngineManager
from twinkle_core.fixtures.repeat_task import completion_row, format_warmup, repeat_prompts, repeat_reward
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.loss.kl import kl_estimate
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.model import TransformersModel, TransformersValueModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl.ppo import critic_values, rollout_explained_variance, with_gae
from twinkle_core.runtime.distributed import all_reduce_sum, env_rank, env_world_size, is_main_process
from twinkle_core.types import SamplingParams

RUNTIMES = ('local', 'torchrun', 'ray')


def init_runtime(runtime: str, ranks: int, with_reference: bool) -> int:
    """Start `runtime` (the one place the runtimes differ); returns this process's data-parallel rank (it picks the
    prompts and sampling seeds of this process: torchrun ranks each roll out their own share)."""
    if runtime == 'torchrun':
        twinkle_core.initialize(mode='local', global_device_mesh=DeviceMesh.from_sizes(dp_size=env_world_size()))
        return env_rank()
    if runtime == 'ray':
        names = ['policy', 'critic', 'sampler'] + (['reference'] if with_reference else [])
        groups = [DeviceGroup(name=name, ranks=1 if name == 'sampler' else ranks) for name in names]
        twinkle_core.initialize(mode='ray', groups=groups)
    return 0


def placement(runtime: str, group: str, ranks: int) -> dict[str, Any]:
    """Where a model lives: this process (local, torchrun: the global data-parallel mesh) or a Ray group of
    `ranks` data-parallel actors."""
    if runtime != 'ray':
        return {}
    return {'remote_group': group, 'device_mesh': DeviceMesh.from_sizes(dp_size=ranks)}


def main(
    steps: int = 60,
    prompts_per_step: int = 16,
    samples_per_prompt: int = 4,
    warmup_steps: int = 60,
    lr: float = 5e-4,
    critic_lr: float = 1e-3,
    gamma: float = 1.0,
    lam: float = 0.95,
    kl_coef: float = 0.0,
    kl_estimator: str = 'k1',
    updates_per_batch: int = 2,
    seed: int = 0,
    work_dir: str | None = None,
    runtime: str = 'local',
    ranks: int = 2,
) -> dict[str, Any]:
    """Train; returns the first / last fifth's means of each curve and the curves (``history``). `runtime`:
    ``'local'``, ``'torchrun'`` (launch the script with torchrun) or ``'ray'`` (`ranks` actors per model)."""
    if runtime not in RUNTIMES:
        raise ValueError(f'runtime must be one of {RUNTIMES}, got {runtime!r}')
    rank = init_runtime(runtime, ranks, with_reference=bool(kl_coef))
    rng = random.Random(seed + 1000 * rank)
    model_dir = str(ensure_tiny_model('tiny'))
    policy = TransformersModel(model_id=model_dir, **placement(runtime, 'policy', ranks))
    template = resolve('template', 'Template', model_id_or_tokenizer=model_dir)
    format_warmup(policy, template, rng, warmup_steps)  # the answer format, not the task
    # every rank of a torchrun job must name the same directory: no temporary one there
    output_dir = work_dir or ('output/ppo' if runtime == 'torchrun' else tempfile.mkdtemp(prefix='twinkle-ppo-'))
    warm_dir = policy.save('warm', output_dir=output_dir)
    # the reference of the KL penalty: a frozen copy of the warm-started policy
    reference = TransformersModel(model_id=warm_dir, **placement(runtime, 'reference', ranks)) if kl_coef else None

    policy.set_optimizer('AdamW', lr=lr)
    policy.set_loss('GRPOLoss', epsilon=0.2, loss_type='bnpo')  # PPO's clipped surrogate, token mean
    # the critic starts from the warm-started policy (as PPO critics start from the SFT or reward model) + a new head
    critic = TransformersValueModel(model_id=warm_dir, **placement(runtime, 'critic', ranks))
    critic.set_optimizer('AdamW', lr=critic_lr)
    critic.set_loss('PPOValueLoss', clip_range=0.2)
    sync = None
    if runtime == 'ray':  # the sampler is its own group: the policy's weights are sent to it before each rollout
        sampler = resolve_class('sampler', 'TorchSampler')(model_id=warm_dir, remote_group='sampler')
        sync = CheckpointEngineManager(model=policy, sampler=sampler)
    else:  # the sampler shares this process's policy weights
        sampler = resolve_class('sampler', 'TorchSampler')(model=policy)
    gae = GAEAdvantage(gamma=gamma, lam=lam)
    history: dict[str, list[float]] = {'reward': [], 'explained_variance': [], 'value_loss': [], 'kl': []}
    progress = tqdm(range(steps), desc='PPO', disable=not is_main_process())
    for step in progress:
        if sync is not None:
            sync.sync_weights()
        prompts = repeat_prompts(rng, prompts_per_step)
        prompt_rows = [template.encode(p, add_generation_prompt=True) for p in prompts]
        sample_seed = seed * 7919 + step + 100_003 * rank
        params = SamplingParams(max_tokens=2, temperature=1.0, num_samples=samples_per_prompt, seed=sample_seed)
        rows, rewards, starts = [], [], []
        for prompt, prompt_row, response in zip(prompts, prompt_rows, sampler.sample(prompt_rows, params)):
            for seq in response.sequences:
                rows.append(completion_row(prompt_row['input_ids'], seq.tokens, seq.logprobs))
                rewards.append(repeat_reward(seq.text or '', prompt['ground_truth'], 1))
                starts.append(len(prompt_row['input_ids']))

        values = critic_values(critic, rows)  # the critic's value before each completion token
        kl = None
        if reference is not None:
            ref_rows = [{'input_ids': r['input_ids']} for r in rows]
            ref = reference.forward_only(inputs=ref_rows, compute_loss=False)['logprobs']
            kl = [kl_estimate(r['old_logps'][s:], q[s:], kl_estimator).tolist() for r, q, s in zip(rows, ref, starts)]
            history['kl'].append(_mean_over_ranks([x for row in kl for x in row]))
        advantages = gae(rewards, values=values, kl=kl, kl_coef=kl_coef)
        critic_rows = with_gae(rows, advantages, values)  # rows get their per-token 'advantages'
        for update in range(updates_per_batch):  # PPO epochs: later ones are off-policy, the clips are active
            policy.forward_backward(inputs=rows)
            policy.clip_grad_and_step(max_norm=1.0)
            out = critic.forward_backward(inputs=critic_rows)
            critic.clip_grad_and_step(max_norm=1.0)
            if update == 0:  # the rollout's values, before this batch's updates
                value_loss = out['metrics']['value_loss']

        history['reward'].append(_mean_over_ranks(rewards))
        # over the whole batch (every rank's): the loss's own metric is a mean over data-parallel shards
        history['explained_variance'].append(_finite(rollout_explained_variance(values, advantages.returns)))
        history['value_loss'].append(value_loss)
        progress.set_postfix(reward=f'{history["reward"][-1]:.2f}', ev=f'{history["explained_variance"][-1]:.2f}')

    window = max(1, steps // 5)
    summary = {
        f'{name}_{end}': fmean(values[:window] if end == 'first' else values[-window:])
        for name, values in history.items()
        if values
        for end in ('first', 'last')
    }
    if is_main_process():
        print({k: round(v, 3) for k, v in summary.items()})
    if sync is not None:
        sync.close()
    if runtime != 'local':
        twinkle_core.shutdown()
    return {**summary, 'history': history}


def _mean_over_ranks(values: list[float]) -> float:
    """The mean of every rank's `values` (under torchrun each rank rolled out its own prompts)."""
    total, count = all_reduce_sum([sum(values), len(values)])
    return total / count


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=60)
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument('--critic-lr', type=float, default=1e-3)
    parser.add_argument('--gamma', type=float, default=1.0)
    parser.add_argument('--lam', type=float, default=0.95)
    parser.add_argument('--kl-coef', type=float, default=0.0)
    parser.add_argument('--kl-estimator', choices=('k1', 'k2', 'k3'), default='k1')
    parser.add_argument('--updates-per-batch', type=int, default=2)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--warmup-steps', type=int, default=60)
    parser.add_argument('--output-dir', default=None, help='where the warm-started policy is saved')
    parser.add_argument('--runtime', choices=RUNTIMES, default='local')
    parser.add_argument('--ranks', type=int, default=2, help='Ray: data-parallel actors of the policy and the critic')
    args = parser.parse_args()
    main(
        steps=args.steps,
        lr=args.lr,
        critic_lr=args.critic_lr,
        gamma=args.gamma,
        lam=args.lam,
        kl_coef=args.kl_coef,
        kl_estimator=args.kl_estimator,
        updates_per_batch=args.updates_per_batch,
        seed=args.seed,
        warmup_steps=args.warmup_steps,
        work_dir=args.output_dir,
        runtime=args.runtime,
        ranks=args.ranks,
    )
