"""LoRA SFT of a vision-language model on image + text data: teach it to name the colour of an image.

The loop is the text SFT loop (examples/sft_lora.py) with three changes: the data rows hold images, the template is
a vision template (``Qwen3VLTemplate``: renders the conversation, runs the image processor, expands each image to
its tokens), and the model is a VL checkpoint (Qwen3-VL / Qwen3.5 load the same way as text models). LoRA adapts
the language model only; the vision tower stays as loaded (``--lora-targets all`` adapts it too).

    python examples/sft_vl.py                       # tiny offline Qwen3-VL fixture, generated images, CPU: ~20 s
    python examples/sft_vl.py --model ms://Qwen/Qwen3-VL-2B-Instruct --lr 1e-4 --steps 200   # a real model
    python examples/sft_vl.py --padding-free        # pack each batch into one row (exact for Qwen3-VL)

The data set is written to ``--data-dir`` as a JSONL file whose rows reference PNG files by path (the layout of
most multimodal SFT sets: ``<image>`` tags in the text, an ``images`` column). At the end every colour is scored
by the model's log-probability of each answer, and the accuracy over held-out images is printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from twinkle_core.dataset import DataLoader, Dataset, DatasetMeta
from twinkle_core.fixtures.images import COLOURS, QUESTION, colour_image
from twinkle_core.fixtures.tiny_vl_model import ensure_tiny_vl_model
from twinkle_core.template.vision import VisionTemplate
from twinkle_transformers.model import TransformersModel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default=None, help='VL model dir or ms:// / hf:// id (default: tiny Qwen3-VL)')
    parser.add_argument('--data-dir', default='output/sft_vl/data', help='where the generated images + JSONL go')
    parser.add_argument('--rows', type=int, default=64, help='training images')
    parser.add_argument('--steps', type=int, default=100)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--lr', type=float, default=1e-2)
    parser.add_argument('--lora-rank', type=int, default=16)
    parser.add_argument(
        '--lora-targets',
        default='language,lm_head',
        help="comma-separated target groups ('language', 'vision', 'all') and module names. The "
        "default also adapts lm_head: the tiny fixture's frozen, randomly initialised output "
        'layer otherwise caps how confident it can get',
    )
    parser.add_argument('--padding-free', action='store_true')
    parser.add_argument('--output-dir', default='output/sft_vl')
    parser.add_argument('--threads', type=int, default=1)
    return parser.parse_args()


def write_colour_dataset(directory: Path, rows: int, seed: int) -> Path:
    """`rows` PNG files of noisy solid colours and a JSONL file of questions about them; returns the JSONL."""
    directory.mkdir(parents=True, exist_ok=True)
    names = list(COLOURS)
    lines = []
    for i in range(rows):
        colour = names[(i + seed) % len(names)]
        path = directory / f'{seed}-{i}-{colour}.png'
        colour_image(colour, (96 + 16 * (i % 3), 112), noise=12, seed=seed * 1000 + i).save(path)
        lines.append(
            {
                'messages': [
                    {'role': 'user', 'content': f'<image>{QUESTION}'},
                    {'role': 'assistant', 'content': colour},
                ],
                'images': [str(path)],
                'colour': colour,
            }
        )
    out = directory / f'colours-{seed}.jsonl'
    out.write_text(''.join(json.dumps(line) + '\n' for line in lines))
    return out


def colour_accuracy(model: TransformersModel, template: VisionTemplate, data: Path) -> float:
    """Share of rows whose highest-log-probability answer among the colour names is the right one."""
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    right = 0
    for row in rows:
        candidates = [
            template.encode({**row, 'messages': [row['messages'][0], {'role': 'assistant', 'content': name}]})
            for name in COLOURS
        ]
        out = model.forward_only(inputs=candidates, compute_loss=False)
        scores = [
            sum(lp for lp, label in zip(lps, c['labels']) if label != -100)
            for lps, c in zip(out['logprobs'], candidates)
        ]
        right += list(COLOURS)[max(range(len(scores)), key=scores.__getitem__)] == row['colour']
    return right / len(rows)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_id = args.model or str(ensure_tiny_vl_model('qwen3_vl'))
    train_file = write_colour_dataset(Path(args.data_dir), args.rows, seed=0)
    held_out = write_colour_dataset(Path(args.data_dir), 16, seed=1)

    dataset = Dataset(DatasetMeta(str(train_file)))
    dataset.set_template('Qwen3VLTemplate', model_id=model_id, max_length=512)
    dataset.encode()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, seed=0)

    model = TransformersModel(model_id)
    targets = args.lora_targets.split(',')
    model.add_adapter_to_model(
        'default', {'r': args.lora_rank, 'lora_alpha': 2 * args.lora_rank, 'target_modules': targets}
    )
    if args.padding_free:
        model.set_processor('CausalLMProcessor', padding_free=True)
    model.set_optimizer('AdamW', lr=args.lr)
    model.set_lr_scheduler('CosineWarmupScheduler', num_warmup_steps=4, num_training_steps=args.steps)

    template = dataset.template
    print(f'accuracy before: {colour_accuracy(model, template, held_out):.2f}')
    step, batches = 0, iter(loader)
    with tqdm(total=args.steps, desc='sft_vl') as bar:
        while step < args.steps:
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                continue
            out = model.forward_backward(inputs=batch)
            model.clip_grad_and_step()
            step += 1
            bar.set_postfix(loss=f'{out["loss"]:.3f}')
            bar.update()
    accuracy = colour_accuracy(model, template, held_out)
    print(f'accuracy after: {accuracy:.2f}')
    print(f'saved LoRA (PEFT format) to {model.save("final", output_dir=args.output_dir)}')


if __name__ == '__main__':
    main()
