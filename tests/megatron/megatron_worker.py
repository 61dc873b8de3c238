"""One training run for the Megatron equality tests: a backend and layout, 3 optimizer steps on a fixed global
batch, then evaluation and a checkpoint. Run in one process or under torchrun (gloo); rank 0 writes
``result.json`` with the per-step losses and grad norms, the evaluation log-probs before and after training and
the checkpoint path."""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from twinkle_core.mesh import DeviceMesh, split_for_dp
from twinkle_core.registry import resolve
from twinkle_core.runtime.distributed import destroy_process_group, env_rank, env_world_size


def batch_rows(seed: int, count: int, vocab: int = 1000) -> list[dict]:
    """Deterministic rows of different lengths; the first 3 tokens of each row are prompt (no loss)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        ids = [rng.randint(3, vocab) for _ in range(rng.randint(6, 24))]
        rows.append({'input_ids': ids, 'labels': [-100] * 3 + ids[3:]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--backend', default='MegatronModel')
    p.add_argument('--tp', type=int, default=1)
    p.add_argument('--pp', type=int, default=1)
    p.add_argument('--vpp', type=int, default=1)
    p.add_argument('--sp', action='store_true')
    p.add_argument('--distributed-optimizer', action='store_true')
    p.add_argument('--adapter', default=None, help='a PEFT adapter directory to start from (LoRA training)')
    p.add_argument('--packed', action='store_true', help='padding-free batches')
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--micro-batch-size', type=int, default=None)
    args = p.parse_args()

    world = env_world_size()
    kwargs = {}
    if args.backend == 'MegatronModel':
        mesh = DeviceMesh.from_sizes(tp_size=args.tp, pp_size=args.pp, world_size=world, device_type='cpu')
        kwargs = dict(device_mesh=mesh, sequence_parallel=args.sp, virtual_pipeline_stages=args.vpp,
                      distributed_optimizer=args.distributed_optimizer)
        dp, dp_rank = mesh.data_world_size, mesh.data_rank(env_rank())
    else:
        dp, dp_rank = 1, 0
    model = resolve('model', args.backend, model_id=args.model, **kwargs)
    if args.adapter:
        model.load(args.adapter)
    if args.packed:
        model.set_processor('CausalLMProcessor', padding_free=True)
    rows, eval_rows = batch_rows(0, 8), batch_rows(1, 4)
    before = model.forward_only(inputs=eval_rows)
    model.set_optimizer('AdamW', lr=2e-3, weight_decay=0.0)
    losses, norms = [], []
    for step in range(args.steps):
        batch = split_for_dp(batch_rows(10 + step, 8), dp)[dp_rank]
        out = model.forward_backward(inputs=batch, micro_batch_size=args.micro_batch_size)
        stepped = model.clip_grad_and_step(max_norm=1.0)
        losses.append(out['loss'])
        norms.append(stepped['grad_norm'])
    after = model.forward_only(inputs=eval_rows)
    checkpoint = model.save('final', output_dir=args.out)
    if env_rank() == 0:
        Path(args.out, 'result.json').write_text(json.dumps({
            'world_size': world, 'losses': losses, 'grad_norms': norms, 'before': before, 'after': after,
            'eval_rows': eval_rows, 'checkpoint': checkpoint, 'metrics': model.calculate_metric()}))
    destroy_process_group()


if __name__ == '__main__':
    main()
