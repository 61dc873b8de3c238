"""SFT with the official tinker SDK against a twinkle server (the Tinker-client example of the Twinkle docs).

    python examples/tinker_client_sft.py                                   # starts a local server itself
    python examples/tinker_client_sft.py --base-url http://127.0.0.1:8000 --api-key tml-... \
        --base-model Qwen/Qwen3-0.6B                                        # an existing server

Trains a LoRA on the self-cognition data for a few steps, saves the state, samples from the trained weights.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import tinker  # noqa: E402
from tinker import types  # noqa: E402
from tqdm import tqdm  # noqa: E402


def build_datums(tokenizer, rows: list[dict]) -> list[types.Datum]:
    """Prompt + answer with loss weight 1 on the answer tokens only."""
    out = []
    for row in rows:
        answer = row['response'].replace('{{NAME}}', 'twinkle').replace('{{AUTHOR}}', 'the twinkle team')
        prompt = tokenizer.encode(f'User: {row["query"]}\nAssistant:')
        completion = tokenizer.encode(f' {answer}') + [tokenizer.eos_token_id]
        tokens = prompt + completion
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={'target_tokens': tokens[1:], 'weights': weights},
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--base-url')
    ap.add_argument('--api-key', default=os.environ.get('TINKER_API_KEY'))
    ap.add_argument('--base-model', default='Qwen/Qwen3-0.6B')
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--batch-size', type=int, default=8)
    ap.add_argument('--lr', type=float, default=2e-3)
    args = ap.parse_args()

    server = None
    if args.base_url is None:
        from _local_server import start_local_server

        server, args.api_key = start_local_server(args.base_model)
        args.base_url = server.base_url
    from twinkle_core.fixtures import data_path

    rows = [json.loads(line) for line in data_path('self_cognition.jsonl').read_text().splitlines()]

    service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
    training = service.create_lora_training_client(base_model=args.base_model, rank=16, seed=0).result()
    data = build_datums(training.get_tokenizer(), rows)
    for step in (bar := tqdm(range(args.steps), desc='sft')):
        batch = [data[(step * args.batch_size + i) % len(data)] for i in range(args.batch_size)]
        fwd = training.forward_backward(batch, 'cross_entropy')
        opt = training.optim_step(types.AdamParams(learning_rate=args.lr))
        out = fwd.result()
        opt.result()
        tokens = sum(float(d.loss_fn_inputs['weights'].to_numpy().sum()) for d in batch)
        bar.set_postfix(loss_per_token=f'{out.metrics["loss:sum"] / tokens:.3f}')
    state = training.save_state('final').result().path
    print('saved training state:', state)

    sampler = training.save_weights_and_get_sampling_client().result()
    tokenizer = training.get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.encode('User: Who are you?\nAssistant:'))
    result = sampler.sample(
        prompt,
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=24, temperature=0.0, stop=[tokenizer.eos_token_id]),
    ).result()
    print('sample:', repr(tokenizer.decode(result.sequences[0].tokens)))
    if server is not None:
        server.stop()


if __name__ == '__main__':
    main()
