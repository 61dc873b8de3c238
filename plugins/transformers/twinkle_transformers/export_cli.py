"""`twinkle export CHECKPOINT OUT [--merge] [--base DIR] [--dtype ...]`: a checkpoint for serving.

Without ``--merge``: a plain Hugging Face / PEFT directory (a sharded save gathered; a consolidated one copied
without the training state). With ``--merge``: a LoRA checkpoint merged into its base model as one plain model
directory (`twinkle_transformers.merge.export_merged`)."""

from __future__ import annotations

import argparse

from twinkle_core.hooks import hook


@hook
def twinkle_cli(subparsers: argparse._SubParsersAction) -> None:
    from twinkle_transformers.merge import DTYPES

    parser = subparsers.add_parser(
        'export',
        help='a checkpoint as a plain Hugging Face / PEFT directory; --merge folds a LoRA into its base',
        description=__doc__.split('\n\n')[1] if __doc__ else None,
    )
    parser.add_argument('checkpoint', help='a checkpoint directory (model.save(...), sharded or not)')
    parser.add_argument('output_dir', help='where to write (replaced atomically if it exists)')
    parser.add_argument('--merge', action='store_true', help='merge a LoRA checkpoint into its base model')
    parser.add_argument('--base', help="the base model directory (default: the adapter's base_model_name_or_path)")
    parser.add_argument('--dtype', default='float32', choices=DTYPES, help='dtype of the merged weights')
    parser.add_argument('--max-shard-size', default='2GB', help='largest safetensors file of the merged model')
    parser.set_defaults(func=export_command)


def export_command(args: argparse.Namespace) -> int:
    from twinkle_transformers.merge import export_merged
    from twinkle_transformers.sharded_checkpoint import export_checkpoint

    if args.merge:
        out = export_merged(
            args.checkpoint, args.output_dir, base=args.base, dtype=args.dtype, max_shard_size=args.max_shard_size
        )
        print(f'wrote {out}: {args.checkpoint} merged into its base model ({args.dtype})')
    else:
        out = export_checkpoint(args.checkpoint, args.output_dir)
        print(f'wrote {out}')
    return 0
