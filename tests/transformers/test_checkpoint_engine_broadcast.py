"""BroadcastCheckpointEngine across two real processes (gloo over TCP on 127.0.0.1).

Rank 0 holds a LoRA training model and syncs twice (base + LoRA, then LoRA only) through small buckets; rank 1
holds a TorchSampler with its own copy of the base and samples after each sync. The parent checks that the
sampler's logprobs equal the training model's for the exact tokens sampled, and that odd dtypes/shapes survive.
Run as a script, this file is the worker: ``python test_checkpoint_engine_broadcast.py RANK PORT OUT MODEL_DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from twinkle_core.utils.net import free_port

PROMPTS = [[5, 6, 7, 8, 9], [100, 200, 300]]
TARGETS = ['q_proj', 'v_proj', 'up_proj']
BUCKET_BYTES = 256 << 10  # small: the tiny model's base spans many buckets


def odd_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        'bf16': torch.randn(3, 5, generator=g).to(torch.bfloat16),
        'i64': torch.arange(7),
        'mask': torch.tensor([True, False, True]),
        'scalar': torch.tensor(2.5),
        'big': torch.randn(300, 300, generator=g),
        'empty': torch.zeros(0, 4),
    }


def sender(port: int, out: Path, model_dir: str) -> None:
    import peft
    from transformers import AutoModelForCausalLM

    from twinkle_core.weight_sync.base import BASE
    from twinkle_core.weight_sync.broadcast import BroadcastCheckpointEngine
    from twinkle_core.weight_sync.manager import CheckpointEngineManager
    from twinkle_transformers.export import ModuleWeights

    torch.manual_seed(0)
    model = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False),
    )
    engine = BroadcastCheckpointEngine(
        init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=2, bucket_bytes=BUCKET_BYTES, timeout_s=120
    )
    engine.send([(BASE, list(odd_tensors().items()))], metadata={'note': 'odd dtypes'})
    manager = CheckpointEngineManager(model=ModuleWeights(model), engine=engine)
    reports = []
    for step in range(2):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if 'lora_B' in name:
                    p.mul_(10.0 if step == 0 else 1.5)
        model.save_pretrained(out / f'adapter_{step}')
        reports.append(vars(manager.sync_weights()))
    (out / 'sender.json').write_text(json.dumps(reports))
    torch.distributed.barrier()
    engine.close()


def receiver(port: int, out: Path, model_dir: str) -> None:
    from twinkle_core.weight_sync.broadcast import BroadcastCheckpointEngine
    from twinkle_core.weight_sync.manager import CheckpointEngineManager
    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(model_dir, device='cpu')
    engine = BroadcastCheckpointEngine(
        init_method=f'tcp://127.0.0.1:{port}', rank=1, world_size=2, bucket_bytes=BUCKET_BYTES, timeout_s=120
    )
    update = engine.receive()
    got = dict(update)
    expected = odd_tensors()
    odd_ok = (
        update.metadata == {'note': 'odd dtypes'}
        and got.keys() == expected.keys()
        and all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in expected.items())
    )
    manager = CheckpointEngineManager(sampler=sampler, engine=engine)
    results = {'odd_ok': odd_ok, 'syncs': []}
    for step in range(2):
        report = manager.sync_weights()
        responses = sampler.sample(PROMPTS, max_tokens=6, seed=step, adapter_name=report.adapter_name)
        results['syncs'].append(
            {
                'report': vars(report),
                'tokens': [r.sequences[0].tokens for r in responses],
                'logprobs': [r.sequences[0].logprobs for r in responses],
            }
        )
    (out / 'receiver.json').write_text(json.dumps(results))
    torch.distributed.barrier()
    engine.close()


def test_broadcast_sync_between_two_processes(tiny_model_dir, tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    port = free_port()
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(rank), str(port), str(tmp_path), str(tiny_model_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail('broadcast workers timed out')
    assert all(p.returncode == 0 for p in procs), '\n'.join(logs)[-4000:]

    sent = json.loads((tmp_path / 'sender.json').read_text())
    received = json.loads((tmp_path / 'receiver.json').read_text())
    assert received['odd_ok']
    assert [s['lora_only'] for s in sent] == [False, True]  # everything first, LoRA only afterwards
    assert sent[1]['num_tensors'] == 2 * 4 * len(TARGETS)
    assert [r['report']['num_tensors'] for r in received['syncs']] == [s['num_tensors'] for s in sent]
    for step, sync in enumerate(received['syncs']):
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        reference = peft.PeftModel.from_pretrained(base, tmp_path / f'adapter_{step}').eval()
        for prompt, tokens, logprobs in zip(PROMPTS, sync['tokens'], sync['logprobs']):
            ids = prompt + tokens
            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([ids])).logits[0, :-1]
            ref = logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0][len(prompt) - 1 :]
            torch.testing.assert_close(torch.tensor(logprobs), ref, atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='NCCL broadcast needs two GPUs')
def test_broadcast_sync_over_nccl(tiny_model_dir, tmp_path):
    """Same flow on two GPUs (NCCL); each worker picks its GPU by rank."""
    test_broadcast_sync_between_two_processes(tiny_model_dir, tmp_path)


if __name__ == '__main__':
    rank, port, out_dir, model_dir = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    (sender if rank == 0 else receiver)(port, out_dir, model_dir)
