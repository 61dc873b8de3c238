"""Four tenants on one MegatronModel for the mixed-call tests (`megatron_worker.py --tenants MODE`): different LoRA
ranks and targets, losses (token-mean cross-entropy, summed cross-entropy, GRPO with per-row advantages and
on-policy old log-probs), optimizers, gradient accumulation and rows per step. Each step gives every tenant its own
rows:

- ``mixed``: ONE ``forward_backward(inputs={adapter: rows}, return_errors=True)`` per step;
- ``separate``: one call per adapter (the reference).

Each tenant's rows are split over the data ranks tenant by tenant (as the Ray proxy splits a mixed call), so a
tenant may have more rows on one rank than on another, or none (dave). At step `NAN_STEP` one of carol's rows
carries a NaN advantage: a mixed call must reject carol alone (her earlier accumulated gradients kept); the separate
reference skips carol's call that step. Each tenant steps after each accepted call."""

from __future__ import annotations

import math

from twinkle_core.mesh import split_for_dp

TENANTS = {
    # name: (LoRA config, adapter seed, loss, optimizer, gradient accumulation, rows per step)
    'alice': (
        {'r': 4, 'lora_alpha': 8},
        1,
        ('CrossEntropyLoss', {}),
        ('AdamW', {'lr': 2e-3, 'weight_decay': 0.0}),
        1,
        8,
    ),
    'bob': (
        {'r': 8, 'lora_alpha': 16, 'target_modules': ['q_proj', 'v_proj']},
        2,
        ('CrossEntropyLoss', {'reduction': 'sum'}),
        ('AdamW', {'lr': 5e-3}),
        1,
        6,
    ),
    'carol': (
        {'r': 2, 'lora_alpha': 4, 'target_modules': ['o_proj', 'down_proj', 'lm_head']},
        3,
        ('GRPOLoss', {}),
        ('Adam', {'lr': 1e-2, 'betas': (0.8, 0.99)}),
        2,
        3,
    ),
    # one row per step: under dp only the first data rank has any of dave's rows
    'dave': (
        {'r': 2, 'lora_alpha': 2, 'target_modules': ['q_proj']},
        4,
        ('CrossEntropyLoss', {}),
        ('AdamW', {'lr': 1e-2}),
        1,
        1,
    ),
}
NAN_STEP = 1


def setup(model) -> None:
    for name, (config, seed, (loss, loss_kwargs), (optim, optim_kwargs), accumulation, _) in TENANTS.items():
        model.add_adapter_to_model(name, config, seed=seed, gradient_accumulation_steps=accumulation)
        model.set_loss(loss, adapter_name=name, **loss_kwargs)
        model.set_optimizer(optim, adapter_name=name, **optim_kwargs)


def step_rows(model, step: int, batch_rows) -> dict[str, list[dict]]:
    """Every tenant's global rows of `step` (carol's with GRPO inputs, one NaN advantage at `NAN_STEP`)."""
    rows = {name: batch_rows(100 * i + step, spec[-1]) for i, (name, spec) in enumerate(TENANTS.items())}
    old = model.forward_only(inputs=rows['carol'], adapter_name='carol', compute_loss=False)['logprobs']
    rows['carol'] = [
        {**row, 'old_logps': lp, 'advantage': (-1.0) ** i * (0.5 + 0.25 * i)}
        for i, (row, lp) in enumerate(zip(rows['carol'], old))
    ]
    if step == NAN_STEP:
        rows['carol'][-1]['advantage'] = math.nan  # the last row: on the last data rank
    return rows


def train(model, mode: str, steps: int, dp: int, dp_rank: int, batch_rows) -> dict:
    log = {name: {'losses': [], 'grad_norms': [], 'errors': []} for name in TENANTS}
    for step in range(steps):
        rows = step_rows(model, step, batch_rows)
        local = {name: split_for_dp(r, dp)[dp_rank] for name, r in rows.items()}
        if mode == 'mixed':
            out = model.forward_backward(inputs=local, return_errors=True)
        else:  # the reference: one call per adapter, carol's poisoned call left out
            out = {
                name: model.forward_backward(inputs=r, adapter_name=name)
                for name, r in local.items()
                if not (name == 'carol' and step == NAN_STEP)
            }
            out.setdefault('carol', {'error': {'stage': 'loss', 'adapter_name': 'carol'}})
        for name, result in out.items():
            if 'error' in result:
                log[name]['errors'].append([step, result['error']['stage']])
                continue
            log[name]['losses'].append(result['loss'])
            log[name]['grad_norms'].append(model.clip_grad_and_step(max_norm=1.0, adapter_name=name)['grad_norm'])
    return log


def evaluate(model, mode: str, rows: list[dict]) -> dict[str, dict]:
    """Each tenant's log-probs and loss on `rows` (this data rank's; one mixed call, or one call each)."""
    if mode == 'mixed':
        return model.forward_only(inputs={name: rows for name in TENANTS})
    return {name: model.forward_only(inputs=rows, adapter_name=name) for name in TENANTS}


def run(model, mode: str, steps: int, dp: int, dp_rank: int, batch_rows, out: str) -> dict:
    """The worker's result: each tenant's training log, evaluation log-probs (this data rank's rows: `after_rows`)
    and loss after training, saved adapter; and a mixed call in which carol's loss raises (her rows lack GRPO's
    advantages)."""
    eval_rows = split_for_dp([{**row, 'advantage': 1.0} for row in batch_rows(1, 4)], dp)[dp_rank]
    setup(model)
    before = evaluate(model, mode, eval_rows)
    log = train(model, mode, steps, dp, dp_rank, batch_rows)
    after = evaluate(model, mode, eval_rows)
    saved = {name: model.save(f'{name}-final', output_dir=out, adapter_name=name) for name in TENANTS}
    probe = model.forward_only(inputs={'alice': eval_rows, 'carol': batch_rows(2, 2)}, return_errors=True)
    rows = split_for_dp(list(range(4)), dp)[dp_rank]  # which evaluation rows this rank's log-probs are
    return {'log': log, 'before': before, 'after': after, 'after_rows': rows, 'saved': saved, 'probe': probe}
