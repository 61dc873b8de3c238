"""The Twinkle documents' listings that run on Ray (examples/seeds/), as a user would: model and sampler groups,
vLLM engines in a group, the HTTP service started by a script."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.seeds.listings import SEEDS, mean_row_loss, run
from twinkle_core.utils.net import free_port


@pytest.mark.slow
def test_readme_ray_sft(tmp_path, tiny_model_dir):
    """README "Train with Ray": LoRA SFT in a Ray group of 2 CPU ranks under an FSDP2 mesh, with gradient
    accumulation and a warm-up cosine schedule; it prints its step-0 metrics and saves a PEFT adapter that lowers
    the loss of the data it trained on."""
    pytest.importorskip('ray')
    import peft
    from transformers import AutoModelForCausalLM

    from twinkle_core.dataset import Dataset, DatasetMeta
    from twinkle_core.fixtures import data_path

    output = run(
        [sys.executable, str(SEEDS / 'readme_ray_sft.py')], tmp_path, env={'TWINKLE_SEED_MODEL': str(tiny_model_dir)}
    )
    assert re.search(r"Current is step 0 of 15, metric: \{'loss': [0-9.]+", output), output[-3000:]
    rows = (
        Dataset(DatasetMeta(str(data_path('self_cognition.jsonl')), data_slice=range(16)))
        .map('SelfCognitionProcessor', {'model_name': 'twinkle LLM', 'model_author': 'ModelScope Community'})
        .set_template('Qwen3_5Template', model_id=str(tiny_model_dir))
        .encode()
        .rows(range(16))
    )
    base = mean_row_loss(AutoModelForCausalLM.from_pretrained(tiny_model_dir), rows)
    tuned = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / 'output' / 'last-checkpoint'
    )
    assert mean_row_loss(tuned, rows) < base - 1e-2


@pytest.mark.slow
def test_ray_grpo_with_vllm(tmp_path, tiny_model_dir):
    """Best-practices guide "GRPO in Ray mode": the policy in the 'model' group, a vLLM engine in the 'sampler'
    group, merged weights synced before every sampling round, GSM8K rewards and group advantages, GRPO steps
    micro-batched inside each call; it runs its MAX_STEPS optimizer steps, logs the reward and training metrics,
    and saves a PEFT adapter that loads. (The fixture has random weights: the rewards are zero, nothing to learn.)"""
    pytest.importorskip('ray')
    pytest.importorskip('vllm')
    output = run([sys.executable, str(SEEDS / 'ray_grpo_vllm.py')], tmp_path, timeout=900)
    steps = re.findall(r"\[Step (\d)/4\] \{'reward/total/mean': [0-9.]+.*'grad_norm': [0-9.e-]+", output)
    assert steps == ['1', '2', '3'], output[-3000:]
    assert 'Training completed. optim_steps=4' in output
    assert 'EngineCore' in output  # the sampler group ran a vLLM engine
    import peft
    from transformers import AutoModelForCausalLM

    peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / 'output' / 'grpo-gsm8k-checkpoint'
    )


@pytest.mark.slow
def test_ray_mode_builds_a_model_group_and_a_vllm_sampler_group(tmp_path, tiny_model_dir):
    """Runtime-modes document, "Ray Mode": the listing (whose train() stops at `...`) builds TransformersModel in the
    'model' group and a vLLM engine in the 'sampler' group, and exits cleanly."""
    pytest.importorskip('ray')
    pytest.importorskip('vllm')
    output = run(
        [sys.executable, str(SEEDS / 'ray_mode_groups.py')], tmp_path, env={'TWINKLE_SEED_MODEL': str(tiny_model_dir)}
    )
    assert 'EngineCore' in output and 'Loading weights' in output


@pytest.mark.slow
def test_http_mode_server_script_serves_on_ray(tmp_path, tiny_model_dir):
    """Training guide "HTTP Mode / Server Setup": `initialize(mode='http', groups=...)` in a script starts the
    service with the 'model' group as each model's training group and the 'sampler' group as its replicas; the
    native client trains through it -- the multi-tenant backend on the listing's 4 data ranks, 2 rows a call (two
    ranks hold none) -- and SIGTERM drains and stops it."""
    import signal
    import time
    import urllib.request

    pytest.importorskip('ray')
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    port, data_dir = free_port(), tmp_path / 'data'
    (tmp_path / 'server.yaml').write_text(
        f'server: {{port: {port}}}\nstorage: {{data_dir: {data_dir}}}\n'
        f'deployment: {{mode: ray, ray: {{num_cpus: 8}}}}\nmodels:\n  - name: tiny\n    path: {tiny_model_dir}\n'
    )
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'TWINKLE_SERVER_CONFIG': str(tmp_path / 'server.yaml')}
    proc = subprocess.Popen(
        [sys.executable, str(SEEDS / 'http_server.py')],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base_url = f'http://127.0.0.1:{port}'
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read()[-5000:]
            try:
                urllib.request.urlopen(f'{base_url}/api/v1/healthz', timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, 'the server did not come up'
                time.sleep(1)
        store = Store(data_dir)
        key = create_api_key(store, 'alice')
        store.close()
        from twinkle_client import init_twinkle_client
        from twinkle_client.model import MultiLoraTransformersModel

        init_twinkle_client(base_url=base_url, api_key=key)
        model = MultiLoraTransformersModel(model_id='tiny')
        model.add_adapter_to_model('default', {'r': 4, 'lora_alpha': 8, 'target_modules': 'all-linear'})
        model.set_optimizer('AdamW', lr=1e-2)
        rows = [{'input_ids': [5, 6, 7, 8, 9, 10], 'labels': [-100, -100, 7, 8, 9, 10]}] * 2
        losses = []
        for _ in range(3):
            losses.append(model.forward_backward(inputs=rows)['loss'])
            model.clip_grad_and_step()
        assert losses[-1] < losses[0]
        replicas = [
            name
            for name in urllib.request.urlopen(f'{base_url}/metrics').read().decode().split()
            if name.startswith('twinkle_live_adapters')
        ]
        assert replicas
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            output = proc.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
    assert 'tiny: training on 4 Ray worker(s), 4 sampler replica(s)' in output, output[-5000:]
