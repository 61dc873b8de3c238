"""Plot held-out evaluation curves (a metric and its 95 % interval vs training step) from a run's metrics JSONL, as
a PNG for the docs: one curve per ``--curve TASK/METRIC`` (or ``--task TASK [--metric M]``), each in its colour.
Pillow only (no plotting library needed).

    python bench/plot_eval_curve.py output/grpo_arithmetic/metrics.jsonl --task arithmetic \\
        --title "SmolLM2-135M-Instruct, GRPO (LoRA): held-out arithmetic" --out docs/images/grpo_arithmetic.png
    python bench/plot_eval_curve.py output/sft_lora/metrics.jsonl --curve self_cognition/accuracy \\
        --curve arithmetic/accuracy --title "SFT: identity learned, arithmetic kept" --out docs/images/sft.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image, ImageDraw

WIDTH, HEIGHT, MARGIN = 720, 400, 60
#: (line, band) colours of the curves, in order
COLOURS = [((30, 90, 200), (200, 220, 250)), ((210, 100, 20), (250, 225, 200)), ((40, 150, 60), (205, 235, 210))]


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


def plot(curves: list[tuple[str, list[tuple[int, float, float, float]]]], title: str, out: Path) -> None:
    """Draw each (label, curve) with its interval band on one 0..1 axis."""
    image = Image.new('RGB', (WIDTH, HEIGHT), 'white')
    draw = ImageDraw.Draw(image)
    last = max(step for _, curve in curves for step, *_ in curve) or 1

    def xy(step: float, value: float) -> tuple[float, float]:
        return (MARGIN + step / last * (WIDTH - 2 * MARGIN), HEIGHT - MARGIN - value * (HEIGHT - 2 * MARGIN))

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):  # horizontal grid and y labels
        y = xy(0, tick)[1]
        draw.line([(MARGIN, y), (WIDTH - MARGIN, y)], fill=(225, 225, 225))
        draw.text((MARGIN - 35, y - 6), f'{tick:.2f}', fill='black')
    for step in sorted({step for _, curve in curves for step, *_ in curve}):
        draw.text((xy(step, 0)[0] - 6, HEIGHT - MARGIN + 8), str(step), fill='black')
    for (_, curve), (_, band_colour) in zip(curves, COLOURS):
        band = [xy(s, hi) for s, _, _, hi in curve] + [xy(s, lo) for s, _, lo, _ in reversed(curve)]
        draw.polygon(band, fill=band_colour)
    for i, ((label, curve), (colour, _)) in enumerate(zip(curves, COLOURS)):
        draw.line([xy(s, v) for s, v, _, _ in curve], fill=colour, width=3)
        for s, v, _, _ in curve:
            x, y = xy(s, v)
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
            draw.text((x + 6, y - 16), f'{v:.2f}', fill=colour)
        draw.text((MARGIN + 230 * i, 36), f'{label} (band: 95 % interval)', fill=colour)
    draw.rectangle([MARGIN, MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN], outline='black')
    draw.text((MARGIN, 20), title, fill='black')
    draw.text((WIDTH // 2 - 60, HEIGHT - 25), 'training step', fill='black')
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('metrics', type=Path, help='the metrics JSONL of a run (TWINKLE_METRICS_JSONL)')
    parser.add_argument('--curve', action='append', default=[], help='TASK/METRIC, e.g. arithmetic/accuracy')
    parser.add_argument('--task', help="(one curve) the evaluated task's name, e.g. arithmetic")
    parser.add_argument('--metric', default='accuracy', help='(with --task)')
    parser.add_argument('--title', default='held-out evaluation')
    parser.add_argument('--out', type=Path, required=True)
    args = parser.parse_args()
    wanted = args.curve + ([f'{args.task}/{args.metric}'] if args.task else [])
    if not wanted or len(wanted) > len(COLOURS) or not all('/' in w for w in wanted):
        parser.error(f'give 1 to {len(COLOURS)} curves as --curve TASK/METRIC (or --task TASK)')
    curves = [(w.replace('/', ' '), read_curve(args.metrics, *w.split('/', 1))) for w in wanted]
    plot(curves, args.title, args.out)
    for label, curve in curves:
        print(f'{label}: ' + ', '.join(f'step {s}: {v:.3f}' for s, v, _, _ in curve))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
