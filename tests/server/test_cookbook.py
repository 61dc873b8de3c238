"""tinker-cookbook recipes, unmodified, against the server: `recipes/chat_sl/train.py` (SFT on the shipped
conversations.jsonl, checkpoints) and `recipes/math_rl/train.py env=arithmetic` (RL: sampling, importance sampling).

The recipe resolves its tokenizer as `AutoTokenizer.from_pretrained('Qwen/Qwen3-0.6B')`; offline that works
from a Hugging Face cache holding the tiny fixture tokenizer under that repo id, and the server serves the
tiny model under the same public alias (`--model Qwen/Qwen3-0.6B=<dir>`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from twinkle_core.fixtures.hub_cache import populate_hf_cache

ALIAS = 'Qwen/Qwen3-0.6B'


@pytest.fixture()
def cookbook_env(tmp_path, tiny_model_dir):
    """(running server under the alias, environment for a recipe subprocess)."""
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    cache = tmp_path / 'hf-cache'
    populate_hf_cache(cache, ALIAS, 'main', Path(tiny_model_dir))
    running = start_in_thread(
        ServerConfig(models={ALIAS: str(tiny_model_dir)}, data_dir=str(tmp_path / 'srv'), port=free_port())
    )
    key = create_api_key(running.service.store, 'cookbook')
    env = {
        **os.environ,
        'HF_HUB_CACHE': str(cache),
        'HF_HUB_OFFLINE': '1',
        'TINKER_API_KEY': key,
        'WANDB_MODE': 'disabled',
    }
    yield running, env
    running.stop()


def _recipe(module: str, env: dict, log_path: Path, base_url: str, *args: str) -> list[dict]:
    cmd = [
        sys.executable,
        '-m',
        module,
        f'model_name={ALIAS}',
        'renderer_name=role_colon',
        f'base_url={base_url}',
        f'log_path={log_path}',
        'behavior_if_log_dir_exists=delete',
        'lora_rank=8',
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (log_path / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_chat_sl_recipe_runs_against_the_server(tmp_path, cookbook_env):
    import tinker_cookbook

    running, env = cookbook_env
    data = Path(tinker_cookbook.__file__).parent / 'example_data' / 'conversations.jsonl'
    metrics = _recipe(
        'tinker_cookbook.recipes.chat_sl.train',
        env,
        tmp_path / 'run',
        running.base_url,
        f'dataset={data}',
        'max_steps=3',
        'batch_size=8',
        'learning_rate=1e-3',
        'max_length=512',
        'save_every=2',
        'eval_every=0',
    )
    assert len(metrics) >= 3 and all('train_mean_nll' in m for m in metrics[:3]), metrics
    for m in metrics:  # shown with `pytest -s` (recorded in docs/server.md)
        print({k: m[k] for k in ('step', 'train_mean_nll', 'learning_rate', 'num_tokens') if k in m})
    runs, _ = running.service.store.training_runs('cookbook', 10, 0)
    assert runs and running.service.store.checkpoints('cookbook')


@pytest.mark.slow
def test_math_rl_recipe_runs_against_the_server(tmp_path, cookbook_env):
    pytest.importorskip('math_verify', reason='the math_rl recipe needs tinker-cookbook[math-rl] extras')
    running, env = cookbook_env
    metrics = _recipe(
        'tinker_cookbook.recipes.math_rl.train',
        env,
        tmp_path / 'rl',
        running.base_url,
        'env=arithmetic',
        'max_steps=2',
        'group_size=4',
        'groups_per_batch=4',
        'learning_rate=1e-3',
        'max_tokens=5',
        'eval_every=0',
        'save_every=0',
    )
    assert [m['step'] for m in metrics] == [0, 1] and all('env/all/reward/total' in m for m in metrics)
    for m in metrics:
        print({k: m[k] for k in ('step', 'env/all/reward/total', 'optim/entropy') if k in m})
    stats = running.service.workers[ALIAS].stats
    assert stats['sample_passes'] >= 1 and stats['train_passes'] >= 2
