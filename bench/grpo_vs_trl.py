"""GRPO step time against Hugging Face TRL's `GRPOTrainer`: the same model, prompts, group size, completion length,
LoRA, loss and optimizer; a step is generation + rewards + one policy update, as a user of either would run it.

Each implementation runs in a fresh process per round (`trl_compare`): ours in this environment (`TorchSampler`
sharing the policy's weights, `GRPOLoss` through `TransformersModel.forward_backward`, as
`examples/grpo_arithmetic.py`), TRL in its own (``--trl-python``) with generation by `model.generate` (no vLLM on
CPU). Both: ``--prompts`` two-digit addition problems a step (the train split of `arithmetic_prompts`, in the same
order), ``--group-size`` completions each of at most ``--max-tokens`` tokens at temperature 1, reward 1 when the
completion's last number is the sum (`reward`, below, for both), group-scaled advantages, the 'grpo' loss with
epsilon 0.2 / 0.28, no KL (beta 0), one update per generation, AdamW lr 2e-4, clip 1.0, LoRA r 16 on all linear
layers, fp32, gradient checkpointing the same for both (off unless ``--gradient-checkpointing``; TRL's `GRPOConfig`
turns it on by default, so it is set explicitly). `--warmup` untimed steps, then `--steps` timed; seconds a step
(median of the timed steps), completion tokens a second and the process's peak RSS; rounds alternate the order;
ours / TRL is TRL's median step time over ours.

    python bench/grpo_vs_trl.py --trl-python trl-env/bin/python                       # SmolLM2-135M-Instruct
    python bench/grpo_vs_trl.py --trl-python trl-env/bin/python --model tiny --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from trl_compare import add_common_flags, model_dir, peak_rss_mib, run_child, trl_run_settings

LORA = {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear', 'lora_dropout': 0.0}
LR = 2e-4
EPSILON, EPSILON_HIGH = 0.2, 0.28
IMPLEMENTATIONS = {'twinkle': 'ours', 'TRL': 'trl'}
SETTINGS = ('prompts', 'group-size', 'max-tokens')  # passed on to the children


def reward(completion: str, answer: str) -> float:
    """1.0 when the completion's last number is `answer` (the arithmetic tasks' rule), else 0.0."""
    numbers = re.findall(r'-?\d+', completion.replace(',', ''))
    return float(bool(numbers) and numbers[-1] == answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_common_flags(parser, steps=5, warmup=1, rounds=2)
    parser.add_argument('--prompts', type=int, default=8, help='problems a step')
    parser.add_argument('--group-size', type=int, default=8)
    parser.add_argument('--max-tokens', type=int, default=16)
    parser.add_argument('--problems', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        problems = json.loads(Path(args.problems).read_text())
        steps = ours_steps if args.child == 'ours' else trl_steps
        print(json.dumps(steps(args, problems)))
        return
    args.model_dir, problems = prepare(args)
    results: dict[str, list[dict]] = {name: [] for name in IMPLEMENTATIONS}
    names = list(IMPLEMENTATIONS)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / 'problems.json'
        path.write_text(json.dumps(problems))
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                extra = ['--problems', str(path)]
                extra += [f'--{flag}={getattr(args, flag.replace("-", "_"))}' for flag in SETTINGS]
                result = run_child(__file__, IMPLEMENTATIONS[name], args, extra)
                results[name].append(result)
                print(
                    f'round {r + 1}: {name:<8} {result["step_s"]:6.2f} s a step ({result["tokens_per_s"]:.0f} '
                    f'completion tokens/s, mean reward {result["mean_reward"]:.2f}), peak RSS '
                    f'{result["peak_rss_mib"]:.0f} MiB',
                    flush=True,
                )
    report(results, args, args.model_dir)


def prepare(args: argparse.Namespace) -> tuple[str, list[dict]]:
    from twinkle_core.eval.arithmetic import arithmetic_prompts

    directory = model_dir(args.model)
    problems = arithmetic_prompts((args.warmup + args.steps) * args.prompts, split='train', seed=0)
    print(f'{directory}: {args.warmup} + {args.steps} steps of {args.prompts} problems x {args.group_size} samples')
    return directory, [{'messages': p['messages'], 'answer': p['ground_truth']} for p in problems]


def report(results: dict[str, list[dict]], args: argparse.Namespace, model_dir: str) -> None:
    step_s = {name: statistics.median(r['step_s'] for r in runs) for name, runs in results.items()}
    print(f'\n{"run":<8} {"s a step (median)":>18} {"completion tok/s":>17} {"peak RSS MiB":>13}   s a step per round')
    for name, runs in results.items():
        rate = statistics.median(r['tokens_per_s'] for r in runs)
        peak = max(r['peak_rss_mib'] for r in runs)
        per_round = ' '.join(f'{r["step_s"]:.2f}' for r in runs)
        print(f'{name:<8} {step_s[name]:>18.2f} {rate:>17.0f} {peak:>13.0f}   {per_round}')
    ratio = step_s['TRL'] / step_s['twinkle']
    print(f'twinkle / TRL (step speed): {ratio:.2f}x')
    if args.json:
        out = {'model': model_dir, 'results': results, 'ratio': ratio, 'args': vars(args)}
        Path(args.json).write_text(json.dumps(out, indent=1))


# ---- the children: one implementation, `warmup` untimed steps, then the rest timed ---------------------------
def summary(step_seconds: list[float], completion_tokens: list[int], rewards: list[float], warmup: int) -> dict:
    timed = step_seconds[warmup:]
    return {
        'step_s': statistics.median(timed),
        'step_seconds': step_seconds,
        'tokens_per_s': sum(completion_tokens[warmup:]) / sum(timed),
        'mean_reward': statistics.fmean(rewards),
        'peak_rss_mib': peak_rss_mib(),
    }


def ours_steps(args: argparse.Namespace, problems: list[dict]) -> dict:
    from twinkle_core.advantage import GRPOAdvantage
    from twinkle_core.fixtures.repeat_task import completion_row
    from twinkle_core.registry import resolve, resolve_class
    from twinkle_core.types import SamplingParams
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(args.model, dtype='float32', gradient_checkpointing=args.gradient_checkpointing)
    model.add_adapter_to_model('default', LORA)
    model.set_optimizer('AdamW', lr=LR, weight_decay=0.0)
    model.set_loss('GRPOLoss', epsilon=EPSILON, epsilon_high=EPSILON_HIGH, loss_type='grpo')
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    sampler = resolve_class('sampler', 'TorchSampler')(model=model)
    sampler.set_template(template)
    advantages = GRPOAdvantage(scale='group')
    seconds: list[float] = []
    tokens: list[int] = []
    rewards: list[float] = []
    for step in range(args.warmup + args.steps):
        batch = problems[step * args.prompts : (step + 1) * args.prompts]
        start = time.perf_counter()
        prompt_rows = [template.encode({'messages': p['messages']}, add_generation_prompt=True) for p in batch]
        params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, num_samples=args.group_size, seed=step)
        rows, step_rewards = [], []
        for problem, prompt_row, response in zip(batch, prompt_rows, sampler.sample(prompt_rows, params)):
            for seq in response.sequences:
                rows.append(completion_row(prompt_row['input_ids'], seq.tokens, seq.logprobs))
                step_rewards.append(reward(seq.text or '', problem['answer']))
        for row, advantage in zip(rows, advantages(step_rewards, group_size=args.group_size)):
            row['advantage'] = advantage
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step(max_norm=1.0)
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(r['input_ids']) - sum(1 for x in r['labels'] if x == -100) for r in rows))
        rewards += step_rewards
    return summary(seconds, tokens, rewards, args.warmup)


def trl_steps(args: argparse.Namespace, problems: list[dict]) -> dict:
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    seconds: list[float] = []
    tokens: list[int] = []
    rewards: list[float] = []

    def reward_fn(completions: list, answer: list[str], **_: object) -> list[float]:
        texts = [c[-1]['content'] if isinstance(c, list) else c for c in completions]
        step_rewards = [reward(t, a) for t, a in zip(texts, answer)]
        rewards.extend(step_rewards)
        return step_rewards

    class Timer(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, targs, state, control, **kwargs):
            seconds.append(time.perf_counter() - self.start)

        def on_log(self, targs, state, control, logs=None, **kwargs):
            if logs and 'completions/mean_length' in logs:
                tokens.append(round(logs['completions/mean_length'] * args.prompts * args.group_size))

    rows = [{'prompt': p['messages'], 'answer': p['answer']} for p in problems]
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.group_size,  # completions a step
            num_generations=args.group_size,
            max_completion_length=args.max_tokens,
            temperature=1.0,
            beta=0.0,
            num_iterations=1,
            epsilon=EPSILON,
            epsilon_high=EPSILON_HIGH,
            loss_type='grpo',
            scale_rewards='group',
            shuffle_dataset=False,
            logging_steps=1,
            **trl_run_settings(
                lr=LR, steps=args.warmup + args.steps, gradient_checkpointing=args.gradient_checkpointing
            ),
        )
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype='float32')
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_fn,
            args=config,
            train_dataset=datasets.Dataset.from_list(rows),
            peft_config=LoraConfig(task_type='CAUSAL_LM', **LORA),
            callbacks=[Timer()],
        )
        trainer.train()
    return summary(seconds, tokens, rewards, args.warmup)


if __name__ == '__main__':
    main()
