"""Four tenants, one base model, one forward/backward per step (docs/architecture.md §4).

- ``twinkle``  : SFT, self-cognition as "Twinkle" by ModelScope      (rank 8, all linear layers)
- ``nova``     : SFT, self-cognition as "Nova" by Acme Labs           (rank 16, attention only, other lr)
- ``pretrain`` : continued pre-training on plain text, loss on every token (rank 4, MLP only, sum loss)
- ``scorer``   : no training; scores answers with log-probs (forward_only) as the others learn

Each training step runs the three trainers' micro-batches in ONE forward and ONE backward of the shared base
model (each token routed to its tenant's adapter), then steps each tenant's own optimizer. At the end both SFT
tenants answer "who are you?" in ONE generation batch, each row with its own adapter.

    python examples/multi_tenant.py    # tiny offline fixture model on CPU: ~35 s of CPU time (OMP_NUM_THREADS=1)
"""

from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

from twinkle_core.dataset import DataLoader, Dataset, DatasetMeta
from twinkle_core.fixtures import data_path
from twinkle_core.fixtures.corpus import PROSE
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_transformers.multi_lora import MixedStepError, MultiLoraTransformersModel, adapter_indices

IDENTITIES = {'twinkle': ('Twinkle', 'ModelScope'), 'nova': ('Nova', 'Acme Labs')}
ADAPTERS = {
    'twinkle': {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear'},
    'nova': {'r': 16, 'lora_alpha': 32, 'target_modules': ['q_proj', 'k_proj', 'v_proj', 'o_proj']},
    'pretrain': {'r': 4, 'lora_alpha': 8, 'target_modules': ['gate_proj', 'up_proj', 'down_proj']},
    'scorer': {'r': 4, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj']},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default=None, help='model dir or ms:// / hf:// id (default: the tiny fixture)')
    parser.add_argument('--steps', type=int, default=80)
    parser.add_argument('--batch-size', type=int, default=8, help='rows per tenant per step')
    parser.add_argument('--log-every', type=int, default=20)
    return parser.parse_args()


def self_cognition_loader(model_id: str, name: str, author: str, batch_size: int, seed: int) -> DataLoader:
    dataset = Dataset(DatasetMeta(str(data_path('self_cognition.jsonl'))))
    dataset.map('SelfCognitionProcessor', init_args={'model_name': name, 'model_author': author})
    dataset.set_template('Template', model_id=model_id, max_length=256)
    dataset.encode()
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, seed=seed)


def pretraining_rows(tokenizer) -> list[dict]:
    """Plain text, loss on every token (labels = input_ids; the first is never predicted)."""
    rows = []
    for line in PROSE.splitlines():
        ids = tokenizer(line)['input_ids']
        if len(ids) > 4:
            rows.append({'input_ids': ids, 'labels': list(ids)})
    return rows


def forever(loader: DataLoader):
    while True:
        yield from loader


def main() -> None:
    args = parse_args()
    model_id = args.model or str(ensure_tiny_model('tiny'))
    torch.manual_seed(0)

    model = MultiLoraTransformersModel(model_id)
    for tenant, config in ADAPTERS.items():
        model.add_adapter_to_model(tenant, config)
        model.set_template('Template', adapter_name=tenant)
    model.set_optimizer('AdamW', lr=3e-3, adapter_name='twinkle')
    model.set_optimizer('AdamW', lr=5e-3, adapter_name='nova')
    model.set_optimizer('AdamW', lr=1e-3, adapter_name='pretrain')
    model.set_loss('CrossEntropyLoss', reduction='sum', adapter_name='pretrain')  # a different loss, same pass
    for tenant in ('twinkle', 'nova'):
        model.set_lr_scheduler(
            'CosineWarmupScheduler',
            num_warmup_steps=5,
            num_training_steps=args.steps,
            min_lr_ratio=0.1,
            adapter_name=tenant,
        )

    template = model.states['twinkle'].template
    loaders = {
        t: forever(self_cognition_loader(model_id, *IDENTITIES[t], args.batch_size, seed=i))
        for i, t in enumerate(IDENTITIES)
    }
    text = pretraining_rows(template.tokenizer)
    answers = {
        t: template.encode(
            {
                'messages': [
                    {'role': 'user', 'content': 'who are you?'},
                    {'role': 'assistant', 'content': f'I am {n}, built by {a}.'},
                ]
            }
        )
        for t, (n, a) in IDENTITIES.items()
    }

    first: dict[str, float] = {}
    progress = tqdm(range(1, args.steps + 1), desc='multi-tenant', unit='step')
    for step in progress:
        batches = {t: next(loaders[t]) for t in IDENTITIES}
        batches['pretrain'] = [text[(step * 2 + i) % len(text)] for i in range(2)]
        try:
            out = model.forward_backward(inputs=batches)  # ONE forward + ONE backward for three tenants
        except MixedStepError as exc:  # a bad tenant never blocks the others: report it, keep the rest
            progress.write(f'step {step}: rejected {sorted(exc.errors)}: {exc}')
            out = exc.results
        for tenant in out:
            model.clip_grad_and_step(max_norm=1.0, adapter_name=tenant)
        first = first or {t: r['loss'] for t, r in out.items()}
        if step % args.log_every == 0 or step == args.steps:
            # The scorer: logprobs of both identity answers under its (untrained) adapter and under the tenants'.
            scores = model.forward_only(
                inputs={'scorer': list(answers.values()), 'twinkle': [answers['twinkle']], 'nova': [answers['nova']]}
            )
            per_tenant = '  '.join(f'{t} {model.calculate_metric(adapter_name=t)["loss"]:.3f}' for t in out)
            progress.write(
                f'step {step}: loss  {per_tenant}  | answer log-prob: '
                f'twinkle {sum(scores["twinkle"]["logprobs"][0]):.1f} (scorer '
                f'{sum(scores["scorer"]["logprobs"][0]):.1f}), nova {sum(scores["nova"]["logprobs"][0]):.1f}'
                f' (scorer {sum(scores["scorer"]["logprobs"][1]):.1f})'
            )

    last = {t: model.calculate_metric(adapter_name=t).get('loss', r['loss']) for t, r in out.items()}
    for t in first:
        print(f'{t:>9}: first loss {first[t]:.3f} -> last {last[t]:.3f}')
    replies = answer_together(model, ['twinkle', 'nova', None], 'who are you?')
    for tenant, reply in replies.items():
        print(f'[{tenant or "base"}] who are you? -> {reply}')
    for tenant, (name, _) in IDENTITIES.items():
        if name not in replies[tenant]:
            raise SystemExit(f'tenant {tenant!r} did not learn its identity: {replies[tenant]!r}; try more --steps.')


def answer_together(model: MultiLoraTransformersModel, tenants: list[str | None], question: str) -> dict:
    """Greedy answers of several adapters (None: the base model) in ONE `generate` batch."""
    template = model.states['twinkle'].template
    prompt = template.encode({'messages': [{'role': 'user', 'content': question}]}, add_generation_prompt=True)
    input_ids = torch.tensor([prompt['input_ids']] * len(tenants), device=model.device)
    model.model.eval()
    with torch.no_grad(), adapter_indices(model.model, model.manager.index_tensor(tenants, device=model.device)):
        output = model.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=30,
            do_sample=False,
            use_cache=True,
            eos_token_id=template.tokenizer.eos_token_id,
            pad_token_id=template.tokenizer.pad_token_id,
        )
    return {t: template.decode(output[i, input_ids.shape[1] :].tolist()) for i, t in enumerate(tenants)}


if __name__ == '__main__':
    main()
