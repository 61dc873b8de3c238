"""Multi-turn rollout throughput: 64 concurrent episodes (one batched sample per turn) vs the same 64 run one at a time.

Workload: `GuessNumberEnv` games (secret in 1..100, `--turns` guesses each) played by the tiny fixture model with
random weights, so nearly every reply is an invalid guess and an episode runs `--turns` sampled turns. A random
model seldom samples its end-of-turn token, so a turn also stops at any of `--stop-fraction` of the vocabulary
(fixed ids; turns of a few to `--max-tokens` tokens, and a turn cut at `--max-tokens` ends its episode, as a
truncated turn does). Sampling is at temperature 1 (a greedy random model repeats one token and never stops), so
the two runs sample different but equally distributed episodes: both episodes/s and sampled tokens/s are
printed, and the ratio is of tokens/s (the work done), with the episodes/s ratio next to it. The batched run is
one ``MultiTurnRollout(sampler, ...)(games)`` call, the other one ``rollout([game])`` call per episode; runs
alternate, medians of `--repeats`.

    .venv/bin/python bench/agentic_rollout.py                         # TorchSampler (prefix cache on)
    .venv/bin/python bench/agentic_rollout.py --no-prefix-cache       # TorchSampler, every turn prefilled again
    .venv/bin/python bench/agentic_rollout.py --sampler vLLMSampler   # vLLM (pip install twinkle-vllm)
    .venv/bin/python bench/agentic_rollout.py --json                  # one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')


def games(n: int) -> list[dict[str, Any]]:
    """`n` guess-the-number prompts with fixed secrets (the env's rules are the user turn)."""
    return [
        {'messages': [{'role': 'system', 'content': 'Play.'}], 'user_data': {'secret': 1 + (7 * i) % 100}}
        for i in range(n)
    ]


def make_sampler(name: str, model_dir: str, threads: int, prefix_cache: bool) -> Any:
    from twinkle_core.registry import resolve_class

    if name == 'TorchSampler':
        cache = {} if prefix_cache else {'prefix_cache_bytes': 0}
        return resolve_class('sampler', 'TorchSampler')(model_id=model_dir, **cache)
    os.environ.setdefault('VLLM_CPU_OMP_THREADS_BIND', f'0-{threads - 1}' if threads > 1 else '0')
    return resolve_class('sampler', name)(model_id=model_dir, engine_args={'max_model_len': 2048})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sampler', default='TorchSampler', help='TorchSampler or vLLMSampler')
    parser.add_argument('--model', default='tiny', choices=['tiny', 'small'])
    parser.add_argument('--episodes', type=int, default=64)
    parser.add_argument('--turns', type=int, default=4)
    parser.add_argument('--max-tokens', type=int, default=32)
    parser.add_argument('--stop-fraction', type=float, default=0.1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument(
        '--no-prefix-cache',
        dest='prefix_cache',
        action='store_false',
        help='TorchSampler: turn its prefix cache off (each turn prefills the whole episode again)',
    )
    parser.add_argument('--json', action='store_true', help='print one JSON line instead of the table')
    args = parser.parse_args()

    import torch

    from twinkle_agentic.rollout import MultiTurnRollout
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_core.registry import resolve

    torch.set_num_threads(args.threads)
    model_dir = ensure_tiny_model(args.model)
    sampler = make_sampler(args.sampler, model_dir, args.threads, args.prefix_cache)
    template = resolve('template', 'Template', model_id_or_tokenizer=model_dir)
    vocab = len(template.tokenizer)
    stop_ids = list(range(10, vocab, max(1, round(1 / args.stop_fraction))))
    rollout = MultiTurnRollout(
        sampler,
        template,
        env='GuessNumberEnv',
        env_kwargs={'max_guesses': args.turns},
        sampling_params={'max_tokens': args.max_tokens, 'temperature': 1.0, 'stop': stop_ids},
        max_turns=args.turns,
    )
    prompts = games(args.episodes)

    def batched() -> list[dict[str, Any]]:
        return rollout(prompts)

    def one_at_a_time() -> list[dict[str, Any]]:
        return [rollout([p])[0] for p in prompts]

    batched()  # warm-up (engine graphs, caches)
    times: dict[str, list[float]] = {'batched': [], 'one_at_a_time': []}
    outputs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for name, run in (('batched', batched), ('one_at_a_time', one_at_a_time)):
            start = time.perf_counter()
            outputs[name] = run()
            times[name].append(time.perf_counter() - start)
    turns = {name: sum(e['turns'] for e in out) for name, out in outputs.items()}
    tokens = {name: sum(len(e['logprobs']) for e in out) for name, out in outputs.items()}
    seconds = {name: statistics.median(t) for name, t in times.items()}
    rate = {name: args.episodes / s for name, s in seconds.items()}
    token_rate = {name: tokens[name] / seconds[name] for name in seconds}
    ratio = token_rate['batched'] / token_rate['one_at_a_time']
    result = {
        'sampler': args.sampler,
        'model': args.model,
        'episodes': args.episodes,
        'turns': turns,
        'sampled_tokens': tokens,
        'episodes_per_s': {k: round(v, 2) for k, v in rate.items()},
        'tokens_per_s': {k: round(v, 1) for k, v in token_rate.items()},
        'ratio': round(ratio, 2),
        'episodes_ratio': round(rate['batched'] / rate['one_at_a_time'], 2),
    }
    reuse = getattr(sampler, 'prefix_cache_stats', None)
    if reuse is not None:
        result['prefix_cache_reused'] = round(reuse['reused_tokens'] / max(reuse['prompt_tokens'], 1), 3)
    if args.json:
        print(json.dumps(result))
        return
    print(f'{args.sampler} on the {args.model} fixture, {args.episodes} episodes (median of {args.repeats}):')
    for name, label in (('batched', 'batched (one sample call per turn)'), ('one_at_a_time', 'one episode at a time')):
        print(
            f'  {label:36s} {rate[name]:7.2f} episodes/s {token_rate[name]:9.1f} tokens/s '
            f'({turns[name]} turns, {tokens[name]} tokens)'
        )
    print(f'  ratio batched / one-at-a-time: {ratio:.2f}x tokens/s, {result["episodes_ratio"]:.2f}x episodes/s')
    if 'prefix_cache_reused' in result:
        print(f'  prompt tokens served from the prefix cache: {result["prefix_cache_reused"]:.1%} (both runs)')


if __name__ == '__main__':
    main()
