"""Multi-turn GRPO through the service with the official tinker SDK: the rollout runs here, the service samples and
trains (as in the tinker-cookbook).

    python examples/agentic_tinker.py                                      # starts a local server itself
    python examples/agentic_tinker.py --base-url http://127.0.0.1:8000 --api-key tml-... \
        --base-model Qwen/Qwen3-0.6B                                        # an existing server

Each episode is a game of `GuessNumberEnv` (guess 1..8 in 3 plain-text guesses, "too low" / "too high" hints).
`MultiTurnRollout` plays every game of a step together, sampling through a `SamplingClient` (`TinkerSampler`: the
requests of a turn are sent at once); each episode becomes ONE `tinker.Datum` (`episode_datum`: the sampled
guesses are trained with their behaviour log-probs, the env's hints are masked) with its group-relative
advantage, trained with ``importance_sampling``; after each step the sampler gets the new weights.

The local server's model is the tiny fixture with random weights, so a short SFT warm-start through the same
client first teaches the answer *format* (random in-range guesses, whatever the hints say); RL then has rewards
that differ within a group.
"""

from __future__ import annotations

import argparse
import os
import random
from statistics import fmean
from typing import Any

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import tinker  # noqa: E402
from tinker import types  # noqa: E402

from twinkle_agentic.envs import GuessNumberEnv  # noqa: E402
from twinkle_agentic.rollout import MultiTurnRollout, TinkerSampler, episode_datum, sft_datum  # noqa: E402
from twinkle_core.advantage import GRPOAdvantage  # noqa: E402
from twinkle_core.registry import resolve  # noqa: E402

GAME = {'low': 1, 'high': 8, 'max_guesses': 3, 'tool': False}


def games(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """`n` games: the rules as the user turn, the secret in ``user_data``."""
    rules = GuessNumberEnv(**GAME).rules()
    return [
        {'messages': [{'role': 'user', 'content': rules}], 'user_data': {'secret': rng.randint(1, 8)}} for _ in range(n)
    ]


def random_game(game: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A warm-start conversation: random in-range guesses and the env's real hints (the format, not the skill)."""
    env = GuessNumberEnv(**GAME)
    env.reset(game)
    messages = list(game['messages'])
    while True:
        guess = str(rng.randint(1, 8))
        messages.append({'role': 'assistant', 'content': guess})
        result = env.respond(guess)
        if result.done:
            return {'messages': messages}
        messages.append({'role': 'user', 'content': result.observation})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--base-url')
    ap.add_argument('--api-key', default=os.environ.get('TINKER_API_KEY'))
    ap.add_argument('--base-model', default='Qwen/Qwen3-0.6B')
    ap.add_argument('--warmup-steps', type=int, default=20, help='format-only SFT steps (0: none)')
    ap.add_argument('--steps', type=int, default=5, help='GRPO steps')
    ap.add_argument('--prompts-per-step', type=int, default=4)
    ap.add_argument('--group-size', type=int, default=4)
    ap.add_argument('--lr', type=float, default=1e-4)
    ap.add_argument('--seed', type=int, default=0)
    args = ap.parse_args()

    server = None
    if args.base_url is None:
        from _local_server import start_local_server

        server, args.api_key = start_local_server(args.base_model)
        args.base_url = server.base_url
    rng = random.Random(args.seed)
    service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
    training = service.create_lora_training_client(base_model=args.base_model, rank=16, seed=args.seed).result()
    template = resolve('template', 'Template', model_id_or_tokenizer=training.get_tokenizer())

    # ---- 1. format-only SFT warm-start (cross-entropy on the assistant turns of random games) ------------------
    for step in range(args.warmup_steps):
        data = [sft_datum(template.encode(random_game(g, rng))) for g in games(rng, 8)]
        fwd = training.forward_backward(data, 'cross_entropy')
        training.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        if step % 10 == 0 or step == args.warmup_steps - 1:
            tokens = sum(float(d.loss_fn_inputs['weights'].to_numpy().sum()) for d in data)
            print(f'warm-start {step}: loss/token {fwd.result().metrics["loss:sum"] / tokens:.3f}')

    # ---- 2. multi-turn GRPO: rollout client-side, sampling and training on the service ---------------------------
    sampler = TinkerSampler(training.save_weights_and_get_sampling_client().result())
    rollout = MultiTurnRollout(
        sampler,
        template,
        env=GuessNumberEnv,
        env_kwargs=GAME,
        sampling_params={'max_tokens': 4, 'temperature': 1.0},
        max_turns=GAME['max_guesses'],
    )
    advantage_fn = GRPOAdvantage(scale='group')
    for step in range(args.steps):
        episodes = rollout([g for g in games(rng, args.prompts_per_step) for _ in range(args.group_size)])
        rewards = [e['reward'] for e in episodes]
        advantages = advantage_fn(rewards, group_size=args.group_size)
        data = [episode_datum(e, a) for e, a in zip(episodes, advantages)]
        out = training.forward_backward(data, 'importance_sampling').result()
        training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        sampler.client = training.save_weights_and_get_sampling_client().result()  # sample the new weights
        turns = fmean(e['turns'] for e in episodes)
        print(f'GRPO {step}: reward {fmean(rewards):.3f}, turns {turns:.2f}, loss {out.metrics["loss:sum"]:.4f}')
    if server is not None:
        server.stop()


if __name__ == '__main__':
    main()
