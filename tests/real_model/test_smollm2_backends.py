"""The other causal-LM paths the docs list, on the real Llama model (SmolLM2-135M-Instruct: 30 layers, tied
embeddings, a 49,152-token vocabulary) as on the Qwen3 fixtures: vLLM samples exactly what TorchSampler samples (the
base model and an adapter), and MultiLoraTransformersModel and MegatronModel train an adapter like
TransformersModel (PEFT), each starting from the same PEFT adapter with random A and B."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinkle_core.registry import resolve

pytestmark = pytest.mark.slow

TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']
PROMPTS = [
    {'messages': [{'role': 'user', 'content': 'What is 12 + 35? Answer with just the number.'}]},
    {'messages': [{'role': 'user', 'content': 'Name a colour.'}]},
]


@pytest.fixture(scope='module')
def smollm2_dir() -> Path:
    from twinkle_core.fixtures.real_models import ensure_real_model

    return ensure_real_model('smollm2')


@pytest.fixture(scope='module')
def adapter_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A PEFT LoRA adapter (r=8, every projection) with random A and B, written by PEFT itself."""
    import peft
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32),
        peft.LoraConfig(r=8, lora_alpha=16, init_lora_weights=False, target_modules=TARGETS),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'lora_B' in name:
                p.mul_(2.0)  # strong enough to change greedy answers
    out = tmp_path_factory.mktemp('smollm2_adapter')
    model.save_pretrained(out)
    return out


@pytest.fixture(scope='module')
def rows(smollm2_dir) -> list[dict]:
    """Four chat rows in the model's own template (labels on the answers)."""
    template = resolve('template', 'Template', model_id_or_tokenizer=str(smollm2_dir))
    answers = ['47', 'Blue.', 'I am an AI assistant.', 'Paris is the capital of France.']
    questions = ['What is 12 + 35?', 'Name a colour.', 'Who are you?', 'What is the capital of France?']
    return [
        template.encode({'messages': [{'role': 'user', 'content': q}, {'role': 'assistant', 'content': a}]})
        for q, a in zip(questions, answers)
    ]


def test_vllm_samples_what_torch_sampler_samples(smollm2_dir, adapter_dir):
    pytest.importorskip('vllm')
    from twinkle_core.types import SamplingParams

    samplers = {
        'vllm': resolve(
            'sampler', 'vLLMSampler', model_id=str(smollm2_dir), engine_args={'max_model_len': 512, 'max_lora_rank': 8}
        ),
        'torch': resolve('sampler', 'TorchSampler', model_id=str(smollm2_dir), device='cpu'),
    }
    try:
        got = {}
        for name, sampler in samplers.items():
            sampler.set_template('Template')
            sampler.add_adapter('random', path=str(adapter_dir))
            params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=True)
            got[name] = [
                sampler.sample(PROMPTS, params, adapter_name=adapter)
                for adapter in (None, 'random')  # the base model, then the adapter
            ]
        for vllm_answers, torch_answers in zip(got['vllm'], got['torch']):
            for v, t in zip(vllm_answers, torch_answers):
                assert v.sequences[0].tokens == t.sequences[0].tokens
                assert v.sequences[0].logprobs == pytest.approx(t.sequences[0].logprobs, abs=2e-3)
        base, adapted = got['torch']
        assert any(b.sequences[0].tokens != a.sequences[0].tokens for b, a in zip(base, adapted))  # adapter used
    finally:
        samplers['vllm'].shutdown()


def peft_losses(model, rows: list[dict], steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(inputs=rows)['loss'])
        model.clip_grad_and_step(max_norm=1.0)
    return losses + [model.forward_only(inputs=rows)['loss']]


def test_multi_lora_model_trains_like_transformers_model(smollm2_dir, adapter_dir, rows):
    from twinkle_transformers.model import TransformersModel
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    reference = TransformersModel(model_id=str(smollm2_dir))
    reference.load(str(adapter_dir))
    reference.set_optimizer('AdamW', lr=1e-3, weight_decay=0.0)
    multi = MultiLoraTransformersModel(model_id=str(smollm2_dir))
    multi.load(str(adapter_dir), adapter_name='tenant')
    multi.set_optimizer('AdamW', lr=1e-3, weight_decay=0.0, adapter_name='tenant')
    want = peft_losses(reference, rows, 2)
    got = []
    for _ in range(2):
        got.append(multi.forward_backward(inputs=rows, adapter_name='tenant')['loss'])
        multi.clip_grad_and_step(max_norm=1.0, adapter_name='tenant')
    got.append(multi.forward_only(inputs=rows, adapter_name='tenant')['loss'])
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)  # fp32, 30 layers: the same to 1e-4 relative
    assert abs(want[-1] - want[0]) > 1e-2  # it trained


def test_megatron_model_trains_like_transformers_model(smollm2_dir, adapter_dir, tmp_path):
    pytest.importorskip('megatron.core')
    pytest.importorskip('twinkle_megatron')
    from spmd_runner import shared_pool

    worker = Path(__file__).resolve().parents[1] / 'megatron' / 'megatron_worker.py'
    pool = shared_pool()
    for backend in ('TransformersModel', 'MegatronModel'):
        (tmp_path / backend).mkdir()
    runs = {
        backend: pool.run_worker(
            smollm2_dir,
            tmp_path / backend,
            nproc=1,
            extra=('--backend', backend, '--adapter', str(adapter_dir), '--steps', '2'),
            worker=worker,
        )
        for backend in ('TransformersModel', 'MegatronModel')
    }
    got, want = runs['MegatronModel'], runs['TransformersModel']
    # fp32, 30 layers, Megatron's own attention and fused kernels: the same to 1e-4 relative
    assert got['losses'] == pytest.approx(want['losses'], rel=1e-4)
    # after two AdamW steps at lr 1e-3: Adam's first updates are about lr * sign(g), so a parameter whose gradient is
    # near 0 can step either way when the backends' gradients differ by rounding -- the loss differs by more than the
    # forward does (measured 1.4e-4 relative on one CPU, under 1e-4 on another: the same code and packages)
    assert got['after']['loss'] == pytest.approx(want['after']['loss'], rel=5e-4)
    for g, w in zip(got['before']['logprobs'], want['before']['logprobs']):  # the same weights, token by token
        assert g == pytest.approx(w, rel=1e-4, abs=1e-4)
    assert abs(want['after']['loss'] - want['losses'][0]) > 1e-2  # it trained


def test_chunked_cross_entropy_equals_full_logits_on_tied_embeddings(smollm2_dir, adapter_dir, rows):
    """`ChunkedCrossEntropyLoss` computes the log-probs from the hidden states and the (tied) output embedding in
    chunks of a 49,152-token vocabulary: the same loss and gradients as the full logits."""
    from twinkle_transformers.model import TransformersModel

    results = {}
    for loss in ('CrossEntropyLoss', 'ChunkedCrossEntropyLoss'):
        model = TransformersModel(model_id=str(smollm2_dir))
        model.load(str(adapter_dir))
        model.set_loss(loss, **({'chunk_tokens': 16} if loss.startswith('Chunked') else {}))
        out = model.forward_backward(inputs=rows)
        grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}
        results[loss] = (out['loss'], grads)
    (full, full_grads), (chunked, chunked_grads) = results['CrossEntropyLoss'], results['ChunkedCrossEntropyLoss']
    assert chunked == pytest.approx(full, abs=1e-5)
    assert full_grads.keys() == chunked_grads.keys() and full_grads
    for name, grad in full_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
