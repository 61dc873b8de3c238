"""Plot a held-out evaluation curve (accuracy and its 95 % interval vs training step) from a run's metrics JSONL, as
a PNG for the docs. Pillow only (no plotting library needed).

    python bench/plot_eval_curve.py output/grpo_arithmetic/metrics.jsonl --task arithmetic \\
        --title "SmolLM2-135M-Instruct, GRPO (LoRA): held-out arithmetic" --out docs/images/grpo_arithmetic.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image, ImageDraw

WIDTH, HEIGHT, MARGIN = 720, 400, 60


def read_curve(path: Path, task: str, metric: str) -> list[tuple[int, float, float, float]]:
    """(step, value, low, high) of ``eval/<task>/<metric>`` in a metrics JSONL, by step."""
    key = f'eval/{task}/{metric}'
    points = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        m = record.get('metrics', {})
        if key in m:
            points[record['step']] = (m[key], m.get(f'{key}_low', m[key]), m.get(f'{key}_high', m[key]))
    if not points:
        raise SystemExit(f'no {key} in {path}')
    return [(step, *points[step]) for step in sorted(points)]


def plot(curve: list[tuple[int, float, float, float]], title: str, label: str, out: Path) -> None:
    image = Image.new('RGB', (WIDTH, HEIGHT), 'white')
    draw = ImageDraw.Draw(image)
    last = max(step for step, *_ in curve) or 1

    def xy(step: float, value: float) -> tuple[float, float]:
        return (MARGIN + step / last * (WIDTH - 2 * MARGIN), HEIGHT - MARGIN - value * (HEIGHT - 2 * MARGIN))

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):  # horizontal grid and y labels
        y = xy(0, tick)[1]
        draw.line([(MARGIN, y), (WIDTH - MARGIN, y)], fill=(225, 225, 225))
        draw.text((MARGIN - 35, y - 6), f'{tick:.2f}', fill='black')
    for step, *_ in curve:
        draw.text((xy(step, 0)[0] - 6, HEIGHT - MARGIN + 8), str(step), fill='black')
    band = [xy(s, hi) for s, _, _, hi in curve] + [xy(s, lo) for s, _, lo, _ in reversed(curve)]
    draw.polygon(band, fill=(200, 220, 250))
    draw.line([xy(s, v) for s, v, _, _ in curve], fill=(30, 90, 200), width=3)
    for s, v, _, _ in curve:
        x, y = xy(s, v)
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=(30, 90, 200))
        draw.text((x + 6, y - 16), f'{v:.2f}', fill='black')
    draw.rectangle([MARGIN, MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN], outline='black')
    draw.text((MARGIN, 20), title, fill='black')
    draw.text((WIDTH // 2 - 60, HEIGHT - 25), 'training step', fill='black')
    draw.text((MARGIN, 36), f'{label} (band: 95 % interval)', fill=(30, 90, 200))
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('metrics', type=Path, help='the metrics JSONL of a run (TWINKLE_METRICS_JSONL)')
    parser.add_argument('--task', required=True, help="the evaluated task's name, e.g. arithmetic")
    parser.add_argument('--metric', default='accuracy')
    parser.add_argument('--title', default='held-out evaluation')
    parser.add_argument('--out', type=Path, required=True)
    args = parser.parse_args()
    curve = read_curve(args.metrics, args.task, args.metric)
    plot(curve, args.title, f'{args.task} {args.metric}', args.out)
    print(f'wrote {args.out}: ' + ', '.join(f'step {s}: {v:.3f}' for s, v, _, _ in curve))


if __name__ == '__main__':
    main()
