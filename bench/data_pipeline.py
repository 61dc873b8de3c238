"""Data pipeline timings, as ratios measured in one process (docs/architecture.md §8).

1. Template label paths: rows/s of the ``{% generation %}``-mask path vs prefix rendering (same output, checked).
2. Encode cache: a second run over the same file + template reads `datasets`' cache instead of re-encoding.

Run: .venv/bin/python bench/data_pipeline.py [--rows 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')


def _best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_label_paths(model_dir: str, trajectories: list[dict]) -> None:
    from transformers import AutoTokenizer

    from twinkle_core.template.chat_template import ChatTemplate

    markers = ChatTemplate(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = tok.chat_template.replace('{%- generation %}', '').replace('{%- endgeneration %}', '')
    prefix = ChatTemplate(tok)
    assert markers.encode_batch(trajectories[:50]) == prefix.encode_batch(trajectories[:50])
    t_markers = _best_of(lambda: markers.encode_batch(trajectories))
    t_prefix = _best_of(lambda: prefix.encode_batch(trajectories))
    n = len(trajectories)
    print(f'labels via generation mask: {n / t_markers:8.0f} rows/s')
    print(
        f'labels via prefix rendering: {n / t_prefix:7.0f} rows/s  '
        f'(ratio prefix/mask time = {t_prefix / t_markers:.2f})'
    )


def bench_encode_cache(model_dir: str, path: str) -> None:
    from twinkle_core.dataset import Dataset

    with tempfile.TemporaryDirectory() as cache:

        def run() -> float:
            start = time.perf_counter()
            ds = Dataset(path, cache_dir=cache).map('MessagesProcessor')
            ds.set_template('Template', model_id=model_dir, max_length=512).encode()
            assert len(ds) > 0
            return time.perf_counter() - start

        first, second = run(), run()
    print(
        f'load+map+encode, first run: {first:.2f}s; second run (cached): {second:.2f}s; '
        f'ratio first/second = {first / second:.1f}x'
    )


def main() -> None:
    import datasets

    from twinkle_core.fixtures import data_path
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rows', type=int, default=2000)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    model_dir = str(ensure_tiny_model('tiny'))
    base = [json.loads(line) for line in data_path('sharegpt_sample.jsonl').read_text().splitlines()]
    rows = [base[i % len(base)] for i in range(args.rows)]
    from twinkle_core.preprocessor.conversation import MessagesProcessor

    bench_label_paths(model_dir, [MessagesProcessor()(r) for r in rows[:500]])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'conversations.jsonl')
        with open(path, 'w') as f:
            for i, r in enumerate(rows):
                f.write(json.dumps({**r, 'id': f'{r["id"]}-{i}'}) + '\n')
        bench_encode_cache(model_dir, path)


if __name__ == '__main__':
    main()
