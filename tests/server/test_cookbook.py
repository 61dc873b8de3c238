"""tinker-cookbook's `recipes/chat_sl/train.py` (unmodified, its shipped conversations.jsonl) against the server.

The recipe resolves its tokenizer as `AutoTokenizer.from_pretrained('Qwen/Qwen3-0.6B')`; offline that works
from a Hugging Face cache holding the tiny fixture tokenizer under that repo id, and the server serves the
tiny model under the same public alias (`--model Qwen/Qwen3-0.6B=<dir>`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ALIAS = 'Qwen/Qwen3-0.6B'


def populate_hf_cache(cache: Path, repo_id: str, src: Path) -> None:
    """Lay out `src`'s files as the hub cache entry of `repo_id` (what `HF_HUB_OFFLINE=1` reads)."""
    commit = '0' * 40
    repo = cache / f'models--{repo_id.replace("/", "--")}'
    snap = repo / 'snapshots' / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, snap / f.name)
    (repo / 'refs').mkdir(exist_ok=True)
    (repo / 'refs' / 'main').write_text(commit)


@pytest.mark.slow
def test_chat_sl_recipe_runs_against_the_server(tmp_path, tiny_model_dir):
    import tinker_cookbook
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.auth import create_api_key
    from twinkle_server.launch import free_port

    cache = tmp_path / 'hf-cache'
    populate_hf_cache(cache, ALIAS, Path(tiny_model_dir))
    data = Path(tinker_cookbook.__file__).parent / 'example_data' / 'conversations.jsonl'
    running = start_in_thread(ServerConfig(models={ALIAS: str(tiny_model_dir)}, data_dir=str(tmp_path / 'srv'),
                                           port=free_port()))
    try:
        key = create_api_key(running.service.store, 'cookbook')
        log_path = tmp_path / 'run'
        env = {**os.environ, 'HF_HUB_CACHE': str(cache), 'HF_HUB_OFFLINE': '1', 'TINKER_API_KEY': key,
               'WANDB_MODE': 'disabled'}
        cmd = [sys.executable, '-m', 'tinker_cookbook.recipes.chat_sl.train', f'model_name={ALIAS}',
               f'dataset={data}', 'renderer_name=role_colon', f'base_url={running.base_url}', 'max_steps=3',
               'batch_size=8', 'lora_rank=8', 'learning_rate=1e-3', 'max_length=512', f'log_path={log_path}',
               'behavior_if_log_dir_exists=delete', 'save_every=2', 'eval_every=0']
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        metrics = [json.loads(line) for line in (log_path / 'metrics.jsonl').read_text().splitlines()]
        assert len(metrics) >= 3 and all('train_mean_nll' in m for m in metrics[:3]), metrics
        for m in metrics:  # shown with `pytest -s` (recorded in docs/server.md)
            print({k: m[k] for k in ('step', 'train_mean_nll', 'learning_rate', 'num_tokens') if k in m})
        runs, _ = running.service.store.training_runs('cookbook', 10, 0)
        assert runs and running.service.store.checkpoints('cookbook')
    finally:
        running.stop()
