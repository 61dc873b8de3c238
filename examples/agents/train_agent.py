"""Train an unmodified agent with GRPO through rollout sessions: G copies of the agent per task, each in its own
session of the current policy, rewarded by a harness that only sees the agent's final answer.

    python examples/agents/train_agent.py                          # a local server (tiny fixture), the tinker SDK
    python examples/agents/train_agent.py --client twinkle         # the same with the native client
    python examples/agents/train_agent.py --agent langgraph_agent  # or agents_sdk_agent: another framework
    python examples/agents/train_agent.py --model smollm2 ...      # a real model (see docs/agents.md for settings)
    python examples/agents/train_agent.py --base-url http://127.0.0.1:8000 --api-key tml-... \\
        --base-model Qwen/Qwen3-0.6B                                # an existing server

The task: "What is the weather in <city>?"; the agent (examples/agents/*_agent.py, which import nothing of twinkle)
calls `get_weather` and answers from its result; the reward is 1 when the answer holds the asked city's forecast.
The local server's model is the tiny fixture with random weights (or ``--model smollm2``: SmolLM2-135M-Instruct,
whose chat template has no tool support, so the server prompts it in the hermes tool format and the warm-start is
rendered in the same one), so an SFT warm-start first teaches the *format* -- call the tool, answer with what it
returned -- on demonstrations of which only half call the city the user named (``--warmup-correct``; the others a
random one): a weak agent, as after a little SFT. GRPO then trains
the skill. Each step: save the policy for sampling, run the agents in rollout sessions of it
(`twinkle_client.RolloutSessions`), train on their episodes with group-relative advantages; the run ends with a
measuring round.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weather_tool import FORECASTS, forecast  # noqa: E402

from twinkle_client import AgentRun, RolloutSessions  # noqa: E402
from twinkle_core.advantage import GRPOAdvantage  # noqa: E402
from twinkle_core.registry import resolve  # noqa: E402

AGENTS = ('openai_agent', 'agents_sdk_agent', 'langgraph_agent')
WARMUP_LR_END = 0.1  # the warm-start's learning rate decays linearly to this fraction of --warmup-lr
ROWS_PER_CALL = 16  # episodes per tinker forward_backward call (TinkerTrainer.grpo)


def model_dir(name: str) -> Path:
    """The local directory of `--model` (built on first use)."""
    if name == 'smollm2':
        from twinkle_core.fixtures.real_models import ensure_real_model

        return ensure_real_model('smollm2')
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model

    return ensure_tiny_model('tiny')


def tool_schemas(agent: str) -> list[dict[str, Any]]:
    """The tool list `agent`'s framework sends for its `get_weather` (as the framework's own converter writes it)."""
    module = importlib.import_module(agent)
    if agent == 'agents_sdk_agent':
        from agents.models.chatcmpl_converter import Converter

        return [Converter.tool_to_openai(module.get_weather)]
    if agent == 'langgraph_agent':
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return [convert_to_openai_tool(module.get_weather)]
    return module.TOOLS


def question(city: str) -> str:
    return f'What is the weather in {city.title()}?'


def score(answer: str, city: str) -> float:
    """1.0 when the agent's answer holds `city`'s forecast."""
    return float(forecast(city) in answer)


def demonstration(city: str, called: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A warm-start conversation: asked about `city`, the tool called for `called`, its result answered."""
    call = {'id': 'call_0', 'type': 'function'}
    call['function'] = {'name': 'get_weather', 'arguments': json.dumps({'city': called.title()})}
    messages = [
        {'role': 'user', 'content': question(city)},
        {'role': 'assistant', 'content': '', 'tool_calls': [call]},
        {'role': 'tool', 'tool_call_id': 'call_0', 'content': forecast(called)},
        {'role': 'assistant', 'content': f'It is {forecast(called)}.'},
    ]
    return {'messages': messages, 'tools': tools}


def group_metrics(groups: list[list[AgentRun]]) -> dict[str, float]:
    runs = [run for group in groups for run in group]
    return {
        'reward': fmean(run.reward for run in runs),
        'calls/run': fmean(sum(len(e['calls']) for e in run.episodes) for run in runs),  # 2: the tool round trip
        'episodes/run': fmean(len(run.episodes) for run in runs),
        'splits': float(sum(len(run.splits) for run in runs)),
        'failed': float(sum(run.error is not None for run in runs)),
    }


def grpo_rows(groups: list[list[AgentRun]]) -> tuple[list[dict[str, Any]], list[float]]:
    """Every recorded episode with its group-relative advantage (a run's episodes share its reward)."""
    advantage_fn = GRPOAdvantage(scale='group')
    rows, advantages = [], []
    for group in groups:
        for run, advantage in zip(group, advantage_fn([run.reward for run in group], group_size=len(group))):
            rows += run.episodes
            advantages += [advantage] * len(run.episodes)
    return rows, advantages


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--base-url', help='a running server (default: start a local one serving --model)')
    ap.add_argument(
        '--model',
        choices=('tiny', 'smollm2'),
        default='tiny',
        help="the local server's model: the tiny fixture or SmolLM2-135M-Instruct (twinkle fixtures smollm2)",
    )
    ap.add_argument('--api-key', default=os.environ.get('TINKER_API_KEY'))
    ap.add_argument('--base-model', default='Qwen/Qwen3-0.6B')
    ap.add_argument('--client', choices=('tinker', 'twinkle'), default='tinker')
    ap.add_argument('--tokenizer', help="with --client twinkle: the base model tokenizer (default: --model's)")
    ap.add_argument('--agent', choices=AGENTS, default='openai_agent')
    ap.add_argument('--warmup-steps', type=int, default=200, help='warm-start SFT steps (0: none)')
    ap.add_argument('--warmup-lr', type=float, default=3e-3, help="the warm-start's first learning rate")
    ap.add_argument(
        '--warmup-correct', type=float, default=0.5, help='the fraction of demonstrations calling the asked city'
    )
    ap.add_argument('--steps', type=int, default=30, help='GRPO steps')
    ap.add_argument('--group-size', type=int, default=8, help='agent runs per task and step')
    ap.add_argument('--lr', type=float, default=1e-4)
    ap.add_argument('--max-tokens', type=int, default=96, help='per model call of the agent')
    ap.add_argument('--concurrency', type=int, default=8)
    ap.add_argument('--seed', type=int, default=0)
    return ap


def train(args: argparse.Namespace) -> dict[str, list[float]]:
    """Warm-start, then GRPO on the agent's runs against the server at ``args.base_url``; per GRPO round (the last
    one only measures) the runs' metrics (`group_metrics`) and the training loss."""
    rng = random.Random(args.seed)
    cities = sorted(FORECASTS)
    tools = tool_schemas(args.agent)
    agent = importlib.import_module(args.agent)
    trainer = (TinkerTrainer if args.client == 'tinker' else NativeTrainer)(args)

    for step in range(args.warmup_steps):  # 1. the format, and a weak start on the skill
        called = [city if rng.random() < args.warmup_correct else rng.choice(cities) for city in cities * 2]
        rows = [demonstration(city, call, tools) for city, call in zip(cities * 2, called)]
        loss = trainer.sft(rows)
        if step % 10 == 0 or step == args.warmup_steps - 1:
            print(f'warm-start {step}: loss/token {loss:.3f}', flush=True)

    def harness(base_url: str, policy: str, city: str) -> float:  # the agent, unmodified; scored by its answer
        answer = agent.run(base_url, args.api_key, policy, question(city), temperature=1.0, max_tokens=args.max_tokens)
        return score(answer, city)

    trainer.start_rl()
    history: dict[str, list[float]] = {}
    with RolloutSessions(args.base_url, args.api_key, concurrency=args.concurrency, failure_reward=0.0) as sessions:
        for step in range(args.steps + 1):  # 2. GRPO: the skill (the city asked for); the last round only measures
            policy = trainer.policy(f'agent-{step}')
            metrics = group_metrics(groups := sessions.run(policy, harness, cities, group_size=args.group_size))
            line = ', '.join(f'{k} {v:.3f}' for k, v in metrics.items())
            if step < args.steps:
                metrics['loss'] = trainer.grpo(*grpo_rows(groups))
            for key, value in metrics.items():
                history.setdefault(key, []).append(value)
            print(
                f'GRPO {step}: {line}, loss {metrics["loss"]:.4f}'
                if step < args.steps
                else f'after {step} steps: {line}'
            )
    trainer.close()
    return history


def main() -> None:
    args = parser().parse_args()
    server = None
    if args.base_url is None:
        from _local_server import start_local_server

        server, args.api_key = start_local_server(args.base_model, str(model_dir(args.model)))
        args.base_url = server.base_url
    try:
        train(args)
    finally:
        if server is not None:
            server.stop()


class TinkerTrainer:
    """Training and policies through the official tinker SDK (`episode_datum`: an episode -> a Datum)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import tinker

        self.types = tinker.types
        service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
        self.training = service.create_lora_training_client(
            base_model=args.base_model, rank=16, seed=args.seed
        ).result()
        self.template = resolve('template', 'Template', model_id_or_tokenizer=self.training.get_tokenizer())
        self.lr, self.warmup_lr, self.warmup_steps, self.sft_steps = args.lr, args.warmup_lr, args.warmup_steps, 0

    def sft(self, conversations: list[dict[str, Any]]) -> float:
        from twinkle_agentic.rollout import sft_datum

        data = [sft_datum(self.template.encode(c)) for c in conversations]
        out = self.training.forward_backward(data, 'cross_entropy')
        lr = self.warmup_lr * (1 - (1 - WARMUP_LR_END) * min(self.sft_steps / max(self.warmup_steps - 1, 1), 1))
        self.training.optim_step(self.types.AdamParams(learning_rate=lr)).result()
        self.sft_steps += 1
        tokens = sum(float(d.loss_fn_inputs['weights'].to_numpy().sum()) for d in data)
        return out.result().metrics['loss:sum'] / tokens

    def grpo(self, episodes: list[dict[str, Any]], advantages: list[float]) -> float:
        """One step; the episodes go in calls of at most `ROWS_PER_CALL` (the loss is a sum, so the gradients
        accumulate exactly): one call holds one forward/backward's activations, which for a real model and a few
        dozen episodes outgrow a small machine's memory."""
        from twinkle_agentic.rollout import episode_datum

        data = [episode_datum(e, a) for e, a in zip(episodes, advantages)]
        calls = [
            self.training.forward_backward(data[i : i + ROWS_PER_CALL], 'importance_sampling')
            for i in range(0, len(data), ROWS_PER_CALL)
        ]
        self.training.optim_step(self.types.AdamParams(learning_rate=self.lr)).result()
        return sum(call.result().metrics['loss:sum'] for call in calls)

    def start_rl(self) -> None:
        pass  # the loss and learning rate are named per call

    def policy(self, name: str) -> str:
        return self.training.save_weights_for_sampler(name=name).result().path

    def close(self) -> None:
        pass


class NativeTrainer:
    """Training and policies through the native client: a remote model, `GRPOLoss` with the sampler's log-probs."""

    def __init__(self, args: argparse.Namespace) -> None:
        from transformers import AutoTokenizer

        from twinkle_client import MultiLoraTransformersModel, TwinkleClient

        self.client = TwinkleClient(args.base_url, args.api_key)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or str(model_dir(args.model)))
        self.template = resolve('template', 'Template', model_id_or_tokenizer=tokenizer)
        self.model = MultiLoraTransformersModel(model_id=args.base_model, client=self.client)
        self.model.add_adapter_to_model('agent', {'r': 16, 'lora_alpha': 32, 'seed': args.seed})
        self.model.set_optimizer('AdamW', lr=args.warmup_lr)
        steps = max(args.warmup_steps - 1, 1)
        self.model.set_lr_scheduler('LinearLR', start_factor=1.0, end_factor=WARMUP_LR_END, total_iters=steps)
        self.lr = args.lr

    def sft(self, conversations: list[dict[str, Any]]) -> float:
        rows = [self.template.encode(c) for c in conversations]
        loss = self.model.forward_backward(inputs=rows)['loss']
        self.model.clip_grad_and_step()
        return float(loss)

    def start_rl(self) -> None:
        self.model.set_loss('GRPOLoss')
        self.model.set_optimizer('AdamW', lr=self.lr)

    def grpo(self, episodes: list[dict[str, Any]], advantages: list[float]) -> float:
        rows = [{k: e[k] for k in ('input_ids', 'labels')} for e in episodes]
        out = self.model.forward_backward(
            inputs=rows, advantages=advantages, old_logps=[e['logprobs'] for e in episodes]
        )
        self.model.clip_grad_and_step()
        return float(out['loss'])

    def policy(self, name: str) -> str:
        return self.model.save(name)

    def close(self) -> None:
        self.client.close()


if __name__ == '__main__':
    main()
