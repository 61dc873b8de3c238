"""`twinkle convert gguf FILE DIR [--dtype float32|bfloat16|float16]`: a GGUF checkpoint as a trainable HF directory
(`twinkle_core.fixtures.gguf.convert_gguf`)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from twinkle_core.fixtures.gguf import DTYPES

    parser = subparsers.add_parser('convert', help='convert checkpoints to trainable Hugging Face directories')
    sub = parser.add_subparsers(dest='convert_command', metavar='{gguf}', required=True)
    gguf = sub.add_parser(
        'gguf',
        help='a GGUF file (any architecture transformers reads) -> safetensors + config + tokenizer, dequantised',
    )
    gguf.add_argument('file', help='the .gguf file')
    gguf.add_argument('output_dir', help='a new (or empty) directory')
    gguf.add_argument('--dtype', default='float32', choices=DTYPES, help='dtype of the written weights')
    gguf.set_defaults(func=gguf_command)


def gguf_command(args: argparse.Namespace) -> int:
    from twinkle_core.fixtures.gguf import convert_gguf

    out = convert_gguf(args.file, args.output_dir, args.dtype)
    print(f'wrote {out} ({args.dtype})')
    return 0
