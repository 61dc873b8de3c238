"""One SPMD training run of TransformersModel on the tiny fixture model -- run alone, or by torchrun on N ranks.

    python train_worker.py --out DIR                                   # one process
    torchrun --nproc_per_node 2 train_worker.py --out DIR --dp 2       # DDP
    torchrun --nproc_per_node 2 train_worker.py --out DIR --fsdp 2     # FSDP2
    torchrun --nproc_per_node 2 train_worker.py --out DIR --cp 2       # Ulysses sequence parallelism
    ... --padding-free                                                 # packed rows (cu_seqlens)
    ... --steps 2 --save-optimizer                                     # first half, checkpoint with optimizer
    ... --steps 2 --skip-steps 2 --resume DIR/final                    # second half, resumed from it
    ... --save-format default                                          # save's default (consolidated)
    ... --value-model                                                  # a critic: PPOValueLoss on per-token returns

Every run trains on the same global batches (rows of different lengths, so ranks hold different token counts),
writes ``result.json`` (per-step losses, the final eval loss/logprobs) and a checkpoint from rank 0.
The script is the same for every world size except for the mesh given to ``twinkle_core.initialize``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import twinkle_core
from twinkle_core.dataset import DataLoader
from twinkle_core.fixtures import random_token_rows
from twinkle_core.mesh import DeviceMesh
from twinkle_core.runtime import distributed

#: tests/fork_server.py imports these once (and every module of the Transformers backend but its samplers) before it
#: forks a run: what a run imports, so that the runs do not pay for it
PRELOAD = (
    'torch',
    'torch.distributed',
    'torch.distributed.fsdp',
    'torch.distributed.tensor',
    'torch._dynamo',
    'transformers',
    'peft',
    'safetensors.torch',
    'twinkle_core.loss',
    'twinkle_core.processor',
    'twinkle_core.template',
    *(f'transformers.models.{m}.modeling_{m}' for m in ('qwen3', 'qwen3_moe')),
)
PRELOAD_PACKAGES = ('twinkle_transformers',)
PRELOAD_SKIP = ('sampler', 'liger')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--model', required=True)
    parser.add_argument('--out', required=True)
    parser.add_argument('--dp', type=int, default=1)
    parser.add_argument('--fsdp', type=int, default=1)
    parser.add_argument('--tp', type=int, default=1)
    parser.add_argument('--cp', type=int, default=1, help='sequence-parallel ranks (Ulysses)')
    parser.add_argument('--ep', type=int, default=1, help='expert-parallel ranks (MoE models)')
    parser.add_argument('--padding-free', action='store_true', help='pack the rows of a batch (cu_seqlens)')
    parser.add_argument('--gradient-checkpointing', action='store_true', help='checkpoint every decoder layer')
    parser.add_argument(
        '--logps-from-hidden', action='store_true', help='log-probs from the hidden states (the chunked path)'
    )
    parser.add_argument('--full', action='store_true', help='full-parameter training instead of LoRA')
    parser.add_argument('--value-model', action='store_true', help='TransformersValueModel (a critic), PPOValueLoss')
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--skip-steps', type=int, default=0, help='start at this global batch of the data')
    parser.add_argument('--save-optimizer', action='store_true', help='save the checkpoint with optimizer state')
    parser.add_argument('--resume', default=None, help='load this checkpoint with load_optimizer=True first')
    parser.add_argument('--weights-only', action='store_true', help='--resume with load_optimizer=False')
    parser.add_argument(
        '--save-format', choices=('gathered', 'sharded', 'default'), default='gathered', help='save(sharded=...)'
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)  # this script's processes share a small CPU
    mesh = DeviceMesh.from_sizes(
        dp_size=args.dp, fsdp_size=args.fsdp, tp_size=args.tp, cp_size=args.cp, ep_size=args.ep
    )
    twinkle_core.initialize(mode='local', global_device_mesh=mesh if mesh.world_size > 1 else None)

    from twinkle_transformers.model import TransformersModel
    from twinkle_transformers.value_model import TransformersValueModel

    torch.manual_seed(0)
    if args.value_model:  # a random head, so that the first steps move the backbone too
        model = TransformersValueModel(args.model, head_init='normal')
        model.set_loss('PPOValueLoss', clip_range=None)
    else:
        model = TransformersModel(args.model, gradient_checkpointing=args.gradient_checkpointing)
    if not args.full:
        model.add_adapter_to_model(
            'default', {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear', 'init_lora_weights': 'gaussian'}
        )
        if args.value_model:
            model.set_loss('PPOValueLoss', clip_range=None)
    if args.padding_free:
        model.set_processor('CausalLMProcessor', padding_free=True)
    hidden_state_logps = []  # calls of the memory-bounded log-prob path
    if args.logps_from_hidden:
        from twinkle_transformers import forward

        model.set_loss('CrossEntropyLoss')
        model.state.loss.logps_from_hidden_states = True
        chunked = forward.compute_logps_from_hidden
        forward.compute_logps_from_hidden = lambda *a, **k: hidden_state_logps.append(1) or chunked(*a, **k)
    model.set_optimizer('AdamW', lr=1e-3)
    if args.resume:
        model.load(args.resume, load_optimizer=not args.weights_only)
    rows = random_token_rows(args.batch_size * (args.skip_steps + args.steps))[args.batch_size * args.skip_steps :]
    if args.value_model:  # returns the state before each token can show: the parity of the token before it
        rows = [with_returns(row) for row in rows]
    loader = DataLoader(rows, batch_size=args.batch_size, device_mesh=model.device_mesh)
    losses, grad_norms = [], []
    for batch in loader:
        losses.append(model.forward_backward(inputs=batch)['loss'])
        grad_norms.append(model.clip_grad_and_step(max_norm=1.0)['grad_norm'])
    eval_rows = random_token_rows(4, seed=1)
    if args.value_model:
        eval_rows = [with_returns(row) for row in eval_rows]
    evaluation = model.forward_only(inputs=eval_rows)  # every rank evaluates the same rows
    direct_call_error = None
    if args.cp > 1:  # the model alone, not through forward_logps, would attend within each rank's slice
        try:
            model.model(input_ids=torch.tensor([[5, 6, 7, 8]]))
        except Exception as e:
            direct_call_error = f'{type(e).__name__}: {e}'
    sharded = {'gathered': False, 'sharded': True, 'default': False}[args.save_format]
    path = model.save('final', output_dir=args.out, save_optimizer=args.save_optimizer, sharded=sharded)
    if distributed.is_main_process():
        result = {
            'losses': losses,
            'grad_norms': grad_norms,
            'eval_loss': evaluation['loss'],
            'eval_logprobs': evaluation['values' if args.value_model else 'logprobs'],
            'checkpoint': path,
            'world_size': distributed.get_world_size(),
            'eval_rows': eval_rows,
            'optimizer_steps': model.state.optimizer_steps,
            'attn_implementation': model.model.config._attn_implementation,
            'experts_implementation': getattr(model.model.config, '_experts_implementation', None),
            'direct_call_error': direct_call_error,
            'hidden_state_logps': len(hidden_state_logps),
        }
        Path(args.out, 'result.json').write_text(json.dumps(result))
    twinkle_core.shutdown()


def with_returns(row: dict) -> dict:
    ids = row['input_ids']
    return {**row, 'returns': [0.0] + [float(ids[i - 1] % 2) for i in range(1, len(ids))]}


if __name__ == '__main__':
    main()
