"""One training run for the Megatron equality tests: a backend and layout, 3 optimizer steps on a fixed global
batch, then evaluation and a checkpoint. Run in one process or under torchrun (gloo); rank 0 writes
``result.json`` with the per-step losses and grad norms, the evaluation log-probs before and after training and
the checkpoint path.

``--loss`` trains with another loss (its per-row inputs are added: GRPO's advantages and on-policy
``old_logps``, DPO's pairs and reference log-probs, GKD's teacher). ``--resume-after K`` also saves a resumable
checkpoint after step K, loads it into a fresh model and trains the remaining steps again (``resumed_losses``,
``resumed_after``). ``--neighbour`` trains a second adapter beside the first (``--adapter``), one step of it after
each step of the first, on other rows with another optimizer: the first adapter's run must not change.
``--tenants mixed|separate`` trains three tenants instead, in mixed calls or one call per adapter (`tenants_run`)."""

from __future__ import annotations

import argparse
import functools
import json
import random
from pathlib import Path

from twinkle_core.mesh import DeviceMesh, split_for_dp
from twinkle_core.registry import resolve
from twinkle_core.runtime.distributed import destroy_process_group, env_rank, env_world_size

PRELOAD = (
    'torch',
    'torch.distributed',
    'torch._dynamo',
    'numpy',
    'transformers',
    'peft',
    'accelerate',
    'megatron.core',
    'twinkle_core.loss',
    'twinkle_core.processor',
    'twinkle_core.template',
    'twinkle_core.hooks',
    *(f'transformers.models.{m}.modeling_{m}' for m in ('qwen3', 'qwen2', 'llama', 'qwen3_moe')),
)
#: tests/fork_server.py imports these (every module of both backends but the samplers) once, before forking runs
PRELOAD_PACKAGES = ('twinkle_megatron', 'twinkle_transformers')
PRELOAD_SKIP = ('sampler', 'liger')


def batch_rows(seed: int, count: int, vocab: int = 1000) -> list[dict]:
    """Deterministic rows of different lengths; the first 3 tokens of each row are prompt (no loss)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        ids = [rng.randint(3, vocab) for _ in range(rng.randint(6, 24))]
        rows.append({'input_ids': ids, 'labels': [-100] * 3 + ids[3:]})
    return rows


def with_loss_inputs(model, rows: list[dict], loss: str) -> list[dict]:
    """`rows` plus what `loss` reads from them."""
    rows = [dict(r) for r in rows]
    if loss == 'GRPOLoss':
        logps = model.forward_only(inputs=rows, compute_loss=False)['logprobs']
        for i, (row, lp) in enumerate(zip(rows, logps)):
            row.update(advantage=(-1.0) ** i * (0.5 + 0.25 * i), old_logps=lp)
    elif loss == 'PPOValueLoss':  # a critic's regression targets; old values 0 (the clip bites at 0.2)
        for i, row in enumerate(rows):
            n = len(row['input_ids'])
            row.update(returns=[0.1 * ((i + j) % 5) for j in range(n)], old_values=[0.0] * n)
    elif loss == 'DPOLoss':
        for i, row in enumerate(rows):
            row['ref_logps'] = [-0.1 * (i % 2 + 1)] * len(row['input_ids'])
    return rows


class Addressed:
    """`model` with the per-adapter calls addressed to `adapter` (needed once a model trains several)."""

    CALLS = {
        'forward_backward',
        'forward_only',
        'clip_grad_and_step',
        'save',
        'set_optimizer',
        'set_lr_scheduler',
        'set_loss',
        'set_processor',
        'calculate_metric',
    }

    def __init__(self, model, adapter: str) -> None:
        self.model, self.adapter = model, adapter

    def __getattr__(self, name: str):
        attr = getattr(self.model, name)
        return functools.partial(attr, adapter_name=self.adapter) if name in self.CALLS else attr


def train(
    model, steps: range, dp: int, dp_rank: int, loss: str | None, micro_batch_size: int | None, neighbour=None
) -> tuple[list[float], list[float]]:
    losses, norms = [], []
    for step in steps:
        rows = with_loss_inputs(model, batch_rows(10 + step, 8), loss)
        out = model.forward_backward(inputs=split_for_dp(rows, dp)[dp_rank], micro_batch_size=micro_batch_size)
        stepped = model.clip_grad_and_step(max_norm=1.0)
        losses.append(out['loss'])
        norms.append(stepped['grad_norm'])
        if neighbour is not None:  # another adapter's step on other rows, between two of this adapter's
            neighbour.forward_backward(inputs=split_for_dp(batch_rows(50 + step, 6), dp)[dp_rank])
            neighbour.clip_grad_and_step(max_norm=1.0)
    return losses, norms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--backend', default='MegatronModel')
    p.add_argument('--tp', type=int, default=1)
    p.add_argument('--pp', type=int, default=1)
    p.add_argument('--vpp', type=int, default=1)
    p.add_argument('--ep', type=int, default=1)
    p.add_argument('--sp', action='store_true')
    p.add_argument('--distributed-optimizer', action='store_true')
    p.add_argument('--adapter', default=None, help='a PEFT adapter directory to start from (LoRA training)')
    p.add_argument('--packed', action='store_true', help='padding-free batches')
    p.add_argument('--compile-layers', default=None, help='a torch.compile backend for every decoder layer')
    p.add_argument('--gradient-checkpointing', default=None, help='a JSON activation checkpointing policy')
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--micro-batch-size', type=int, default=None)
    p.add_argument('--loss', default=None)
    p.add_argument('--teacher', default=None, help='GKD teacher model directory')
    p.add_argument('--resume-after', type=int, default=None)
    p.add_argument('--neighbour', action='store_true', help='train a second adapter beside --adapter')
    p.add_argument('--head-seed', type=int, default=None, help='a value model: its new head drawn from this seed')
    p.add_argument('--tenants', choices=('mixed', 'separate'), default=None, help='three tenants (tenants_run.py)')
    args = p.parse_args()

    world = env_world_size()
    kwargs = {}
    if args.backend.startswith('Megatron'):
        mesh = DeviceMesh.from_sizes(
            tp_size=args.tp, pp_size=args.pp, ep_size=args.ep, world_size=world, device_type='cpu'
        )
        kwargs = dict(
            device_mesh=mesh,
            sequence_parallel=args.sp,
            virtual_pipeline_stages=args.vpp,
            distributed_optimizer=args.distributed_optimizer,
        )
        dp, dp_rank = mesh.data_world_size, mesh.data_rank(env_rank())
    else:
        dp, dp_rank = 1, 0
    if args.compile_layers:
        kwargs['compile_layers'] = args.compile_layers
    if args.head_seed is not None:
        kwargs.update(head_init='normal', head_seed=args.head_seed)
    if args.gradient_checkpointing:
        kwargs['gradient_checkpointing'] = json.loads(args.gradient_checkpointing)

    def build():
        model = resolve('model', args.backend, model_id=args.model, **kwargs)
        if args.adapter:
            model.load(args.adapter)
        if args.packed:
            model.set_processor('CausalLMProcessor', padding_free=True)
        if args.loss == 'GKDLoss':
            model.set_loss('GKDLoss', teacher_model=args.teacher)
        elif args.loss is not None:
            model.set_loss(args.loss)
        return model

    model = build()
    if args.tenants:
        import tenants_run

        result = tenants_run.run(model, args.tenants, args.steps, dp, dp_rank, batch_rows, args.out)
        if env_rank() == 0:
            Path(args.out, 'result.json').write_text(json.dumps({'world_size': world, **result}))
        destroy_process_group()
        return
    neighbour = None
    if args.neighbour:
        first = model.list_adapters()[0]
        model.add_adapter_to_model(
            'neighbour', {'r': 8, 'lora_alpha': 16, 'target_modules': ['q_proj', 'v_proj']}, seed=7
        )
        neighbour = Addressed(model, 'neighbour')
        neighbour.set_optimizer('AdamW', lr=5e-2)
        neighbour.set_loss('CrossEntropyLoss', reduction='sum')
        neighbour.forward_backward(inputs=batch_rows(40, 4))  # pending gradients of the neighbour while the
        model = Addressed(model, first)  # first adapter trains: they must not leak
    eval_rows = batch_rows(1, 4)
    before = model.forward_only(inputs=with_loss_inputs(model, eval_rows, args.loss))
    model.set_optimizer('AdamW', lr=2e-3, weight_decay=0.0)
    model.set_lr_scheduler('CosineAnnealingLR', T_max=10)
    result = {'world_size': world, 'before': before, 'eval_rows': eval_rows}
    result['compile_backend'] = getattr(model, 'compile_backend', None)
    result['checkpointed_layers'] = getattr(model, 'checkpointed_layers', [])
    if args.resume_after is None:
        losses, norms = train(model, range(args.steps), dp, dp_rank, args.loss, args.micro_batch_size, neighbour)
    else:
        losses, norms = train(model, range(args.resume_after), dp, dp_rank, args.loss, args.micro_batch_size)
        middle = model.save('middle', output_dir=args.out, save_optimizer=True)
        rest = range(args.resume_after, args.steps)
        more = train(model, rest, dp, dp_rank, args.loss, args.micro_batch_size)
        losses, norms = losses + more[0], norms + more[1]
        fresh = build()
        fresh.load(middle, load_optimizer=True)
        result['resumed_losses'] = train(fresh, rest, dp, dp_rank, args.loss, args.micro_batch_size)[0]
        result['resumed_after'] = fresh.forward_only(inputs=with_loss_inputs(fresh, eval_rows, args.loss))
    after = model.forward_only(inputs=with_loss_inputs(model, eval_rows, args.loss))
    checkpoint = model.save('final', output_dir=args.out)
    if neighbour is not None:
        result['neighbour_checkpoint'] = neighbour.save('neighbour', output_dir=args.out)
    elif args.adapter and args.backend == 'MegatronModel':  # removing the adapter gives back the base model
        model.remove_adapter(model.list_adapters()[0])
        result['base_after_remove'] = model.forward_only(inputs=eval_rows)['logprobs']
    if env_rank() == 0:
        result.update(
            losses=losses, grad_norms=norms, after=after, checkpoint=checkpoint, metrics=model.calculate_metric()
        )
        Path(args.out, 'result.json').write_text(json.dumps(result))
    destroy_process_group()


if __name__ == '__main__':
    main()
