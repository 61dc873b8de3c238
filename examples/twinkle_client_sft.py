"""SFT through the native twinkle client (no torch on the client), with checkpoint + resume.

    python examples/twinkle_client_sft.py                                  # starts a local server itself
    python examples/twinkle_client_sft.py --base-url http://127.0.0.1:8000 --api-key tml-...
    python examples/twinkle_client_sft.py --base-url ... --api-key ... --resume twinkle://<run>/weights/step-5

The remote `MultiLoraTransformersModel` has the local class's methods (forward_backward, clip_grad_and_step,
save, load, ...); batches are encoded here with the tokenizer and sent as InputFeature rows.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from tqdm import tqdm  # noqa: E402

from twinkle_client import MultiLoraTransformersModel, init_twinkle_client  # noqa: E402


def encode(tokenizer, row: dict) -> dict:
    answer = row['response'].replace('{{NAME}}', 'twinkle').replace('{{AUTHOR}}', 'the twinkle team')
    prompt = tokenizer.encode(f'User: {row["query"]}\nAssistant:')
    completion = tokenizer.encode(f' {answer}') + [tokenizer.eos_token_id]
    return {'input_ids': prompt + completion, 'labels': [-100] * len(prompt) + completion}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--base-url')
    ap.add_argument('--api-key', default=os.environ.get('TINKER_API_KEY'))
    ap.add_argument('--base-model', default='Qwen/Qwen3-0.6B')
    ap.add_argument('--tokenizer', help='local tokenizer directory (default: the tiny fixture model)')
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--save-every', type=int, default=5)
    ap.add_argument('--resume', help='a twinkle:// checkpoint to continue from (weights + optimizer)')
    args = ap.parse_args()

    server = None
    if args.base_url is None:
        from _local_server import start_local_server

        server, args.api_key = start_local_server(args.base_model)
        args.base_url = server.base_url
    from transformers import AutoTokenizer  # tokenizers only; no torch needed for the client itself

    from twinkle_core.fixtures import data_path
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or str(ensure_tiny_model('tiny')))
    rows = [encode(tokenizer, json.loads(line)) for line in data_path('self_cognition.jsonl').read_text().splitlines()]

    client = init_twinkle_client(base_url=args.base_url, api_key=args.api_key)
    model = MultiLoraTransformersModel(model_id=args.base_model)
    if args.resume:
        model.load(args.resume, load_optimizer=True, adapter_name='sft')
    else:
        model.add_adapter_to_model('sft', {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'})
        model.set_optimizer('AdamW', lr=2e-3, adapter_name='sft')
    last = None
    for step in (bar := tqdm(range(1, args.steps + 1), desc='sft')):
        batch = [rows[(step * 8 + i) % len(rows)] for i in range(8)]
        out = model.forward_backward(inputs=batch, adapter_name='sft')
        model.clip_grad_and_step(1.0, adapter_name='sft')
        bar.set_postfix(loss=f'{out["loss"]:.3f}')
        if step % args.save_every == 0:
            last = model.save(f'step-{step}', save_optimizer=True, adapter_name='sft')
    print('last checkpoint:', last, '(resume with --resume', last, ')')
    print('runs:', [r['training_run_id'] for r in client.list_training_runs()][:3])
    if server is not None:
        server.stop()


if __name__ == '__main__':
    main()
