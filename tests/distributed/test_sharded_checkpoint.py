"""Sharded (DCP) checkpoints: every rank writes its shards, any world size resumes them exactly, and
`export_checkpoint` turns them into a Hugging Face / PEFT directory that plain transformers + peft load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from spmd_runner import run_worker
from test_optimizer_checkpoint import FSDP, LORA, K, _train

from twinkle_core.errors import InvalidInputError
from twinkle_core.fixtures import random_token_rows
from twinkle_transformers.merge import export_merged
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.sharded_checkpoint import DCP_DIR, export_checkpoint


def _model(model_dir: Path, lora: dict | None = LORA) -> TransformersModel:
    torch.manual_seed(0)
    model = TransformersModel(str(model_dir))
    if lora is not None:
        model.add_adapter_to_model('default', lora)
    model.set_optimizer('AdamW', lr=1e-3)
    return model


def _meta(path: str) -> dict:
    return json.loads((Path(path) / 'twinkle_checkpoint.json').read_text())


# ---- one process ---------------------------------------------------------------------------------------------
def test_sharded_save_in_one_process_resumes_exactly(tiny_model_dir, tmp_path) -> None:
    batches = [random_token_rows(4, seed=s) for s in range(2 * K)]
    model = _model(tiny_model_dir)
    _train(model, batches[:K])
    path = model.save('dcp', output_dir=str(tmp_path), save_optimizer=True, sharded=True)
    assert _meta(path)['format'] == 'dcp' and (Path(path) / DCP_DIR / '.metadata').exists()
    assert not (Path(path) / 'adapter_model.safetensors').exists()
    expected = _train(model, batches[K:])

    resumed = TransformersModel(str(tiny_model_dir))  # the adapter is added from the checkpoint
    resumed.load(path, load_optimizer=True)
    assert resumed.state.optimizer_steps == K
    assert _train(resumed, batches[K:]) == expected  # bit for bit


def test_sharded_checkpoint_of_another_model_is_a_clear_error(tiny_model_dir, tmp_path) -> None:
    lora_path = _model(tiny_model_dir).save('lora', output_dir=str(tmp_path), sharded=True)
    full_path = _model(tiny_model_dir, lora=None).save('full', output_dir=str(tmp_path), sharded=True)
    with pytest.raises(InvalidInputError, match='holds full model weights'):
        _model(tiny_model_dir).load(full_path)
    with pytest.raises(InvalidInputError, match='another base model or LoRA config'):
        _model(tiny_model_dir, {**LORA, 'r': 4}).load(lora_path)
    other = TransformersModel(str(tiny_model_dir))
    other.add_adapter_to_model('other', LORA)
    with pytest.raises(InvalidInputError, match="adapter 'default'"):
        other.load(lora_path)


# ---- torchrun: saved by FSDP2 on 2 gloo ranks, resumed on 2, 1 and 4 -------------------------------------------
@pytest.fixture(scope='module')
def dcp_lora(tiny_model_dir, tmp_path_factory) -> dict:
    """FSDP2 LoRA on 2 ranks: 2K steps straight, and K steps saved sharded."""
    root = tmp_path_factory.mktemp('dcp_lora')
    half = ('--steps', str(K), '--save-optimizer', '--save-format', 'sharded')
    return {
        'straight': run_worker(tiny_model_dir, root / 'straight', nproc=2, extra=(*FSDP, '--steps', str(2 * K))),
        'half': run_worker(tiny_model_dir, root / 'half', nproc=2, extra=(*FSDP, *half)),
    }


def _resume(model_dir: Path, out: Path, checkpoint: str, *, nproc: int, extra: tuple[str, ...] = ()) -> dict:
    return run_worker(
        model_dir, out, nproc=nproc, extra=(*extra, '--steps', str(K), '--skip-steps', str(K), '--resume', checkpoint)
    )


@pytest.mark.slow
def test_fsdp2_sharded_save_writes_per_rank_shards(dcp_lora) -> None:
    path = Path(dcp_lora['half']['checkpoint'])
    assert _meta(str(path))['format'] == 'dcp' and _meta(str(path))['world_size'] == 2
    assert sorted(p.name for p in (path / DCP_DIR).glob('*.distcp')) == ['__0_0.distcp', '__1_0.distcp']
    assert not (path / 'adapter_model.safetensors').exists()  # nothing was gathered


@pytest.mark.slow
@pytest.mark.parametrize('nproc', [2, 1, 4])
def test_sharded_checkpoint_resumes_exactly_on_any_world_size(tiny_model_dir, tmp_path, dcp_lora, nproc) -> None:
    mesh = ('--fsdp', str(nproc)) if nproc > 1 else ()
    resumed = _resume(tiny_model_dir, tmp_path, dcp_lora['half']['checkpoint'], nproc=nproc, extra=mesh)
    assert resumed['optimizer_steps'] == 2 * K
    # 2 ranks: the same reductions, bit-exact up to float noise; 1 and 4 ranks sum gradients in another order
    want = dcp_lora['straight']['losses'][K:]
    assert resumed['losses'] == pytest.approx(want, abs=1e-5 if nproc == 2 else 1e-4)


@pytest.mark.slow
def test_export_of_sharded_lora_loads_in_plain_peft_with_the_same_logits(tiny_model_dir, tmp_path, dcp_lora) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    half = dcp_lora['half']
    exported = export_checkpoint(half['checkpoint'], tmp_path / 'export')
    assert sorted(os.listdir(exported)) == ['adapter_config.json', 'adapter_model.safetensors']

    twinkle = TransformersModel(str(tiny_model_dir))
    twinkle.load(half['checkpoint'])  # one process reads the 2-rank shards
    evaluation = twinkle.forward_only(inputs=half['eval_rows'])
    for got, want in zip(evaluation['logprobs'], half['eval_logprobs']):
        assert got == pytest.approx(want, abs=1e-4)

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    plain = PeftModel.from_pretrained(base, exported).eval()
    twinkle.model.eval()
    ids = torch.tensor([half['eval_rows'][0]['input_ids']])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, twinkle.model(input_ids=ids).logits)
        # `twinkle export --merge` of the same shards: one plain model, no peft, the same logits (1e-4)
        merged = AutoModelForCausalLM.from_pretrained(export_merged(half['checkpoint'], tmp_path / 'merged'))
        torch.testing.assert_close(merged(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_export_of_sharded_full_model_loads_in_plain_transformers(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    run = run_worker(
        tiny_model_dir, tmp_path / 'run', nproc=2, extra=(*FSDP, '--full', '--steps', '1', '--save-format', 'sharded')
    )
    exported = export_checkpoint(run['checkpoint'], tmp_path / 'export', max_shard_bytes=1 << 20)
    files = os.listdir(exported)
    assert 'config.json' in files and 'model.safetensors.index.json' in files  # streamed into several files

    twinkle = TransformersModel(str(tiny_model_dir))
    twinkle.set_optimizer('AdamW', lr=1e-3)  # full-parameter: a full sharded checkpoint loads into it
    twinkle.load(run['checkpoint'])
    plain = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    twinkle.model.eval()
    ids = torch.tensor([run['eval_rows'][0]['input_ids']])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, twinkle.model(input_ids=ids).logits)
    evaluation = twinkle.forward_only(inputs=run['eval_rows'])
    for got, want in zip(evaluation['logprobs'], run['eval_logprobs']):
        assert got == pytest.approx(want, abs=1e-4)
