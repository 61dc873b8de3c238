"""Megatron tests: every run is a separate process (Megatron keeps its process groups in module state), shared
through `megatron_run`, which caches each distinct run for the session. The runs are forked from the test process's fork
servers (spmd_runner.shared_pool) that import torch, megatron-core and transformers once per rank instead of once per
run; ``TWINKLE_TESTS_FORK_SERVER=0`` starts each run under torchrun instead."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip('megatron.core')
pytest.importorskip('twinkle_megatron')

from spmd_runner import shared_pool  # noqa: E402

WORKER = Path(__file__).with_name('megatron_worker.py')


@pytest.fixture(scope='session')
def peft_adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A PEFT LoRA adapter (r=4, every linear layer and the output layer) with random A *and* B, written by PEFT
    itself: LoRA runs of both backends start from it, and a zero B would hide a wrong B-side forward."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(
            r=4,
            lora_alpha=8,
            init_lora_weights=False,
            target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'lm_head'],
        ),
    )
    out = tmp_path_factory.mktemp('peft_adapter')
    model.save_pretrained(out)
    return out


@pytest.fixture(scope='session')
def megatron_runner(tmp_path_factory) -> Callable[..., dict]:
    """`run(model_dir, nproc, *args)` -> the worker's result.json; each distinct run happens once per session."""
    cache: dict[tuple, dict] = {}
    pool = shared_pool()

    def run(model_dir: Path, nproc: int, *args: str) -> dict:
        key = (str(model_dir), nproc, *map(str, args))
        if key not in cache:
            out = tmp_path_factory.mktemp('megatron_run')
            cache[key] = pool.run_worker(model_dir, out, nproc=nproc, extra=tuple(map(str, args)), worker=WORKER)
        return cache[key]

    return run


@pytest.fixture(scope='session')
def megatron_run(megatron_runner, tiny_model_dir) -> Callable[..., dict]:
    """`run(nproc, *args)`: `megatron_runner` on the tiny Qwen3 fixture."""
    return lambda nproc, *args: megatron_runner(tiny_model_dir, nproc, *args)
