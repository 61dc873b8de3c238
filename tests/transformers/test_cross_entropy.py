"""CrossEntropyLoss reductions and weights; chunked log-probs (from logits and from hidden states) equal the
plain computation in values and gradients, on a real model."""

from __future__ import annotations

import logging

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.cross_entropy import ChunkedCrossEntropyLoss, CrossEntropyLoss
from twinkle_core.processor.causal_lm import CausalLMProcessor
from twinkle_core.registry import resolve
from twinkle_transformers import forward
from twinkle_transformers.forward import compute_logps, compute_logps_from_hidden
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.multi_lora import MultiLoraTransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')


def make_rows(seed: int, lengths=(6, 11, 4)) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(3, 1100, (n,), generator=g).tolist()
        weights = (torch.randn(n, generator=g) * 2).tolist()  # arbitrary real weights, negative included
        rows.append({'input_ids': ids, 'labels': [-100] * 2 + ids[2:], 'weights': weights})
    return rows


def fake_outputs(batch: dict, seed: int = 0) -> dict:
    """Random log-probs on the loss positions, shaped like a model's outputs."""
    g = torch.Generator().manual_seed(seed)
    mask = batch['labels'] != -100
    logps = -torch.rand(batch['labels'].shape, generator=g) * 5
    return {'logps': torch.where(mask, logps, 0.0), 'mask': mask}


@pytest.mark.parametrize('padding_free', [False, True])
def test_reductions_match_their_definition(padding_free):
    rows = make_rows(0)
    batch = CausalLMProcessor(padding_free=padding_free)(rows)
    outputs = fake_outputs(batch)
    logps, mask, w = outputs['logps'], outputs['mask'], batch['weights']
    token = -(logps * w)[mask]
    assert CrossEntropyLoss('sum')(batch, outputs)['loss'].item() == pytest.approx(token.sum().item(), rel=1e-6)
    out = CrossEntropyLoss()(batch, outputs)
    assert out['num_tokens'] == int(mask.sum())
    assert out['loss'].item() == pytest.approx(token.sum().item() / mask.sum().item(), rel=1e-6)
    rows_index = batch['row_index'][mask]
    per_row = [token[rows_index == r].mean() for r in range(len(rows))]
    expected = torch.stack(per_row).mean().item()
    assert CrossEntropyLoss('sequence_mean')(batch, outputs)['loss'].item() == pytest.approx(expected, rel=1e-6)


def test_sequence_mean_is_layout_independent():
    rows = make_rows(1)
    padded, packed = CausalLMProcessor()(rows), CausalLMProcessor(padding_free=True)(rows)
    # the same per-token log-probs in both layouts
    flat = -torch.arange(1, padded['labels'].numel() + 1, dtype=torch.float32).view(padded['labels'].shape) / 10
    out_padded = {'logps': torch.where(padded['labels'] != -100, flat, 0.0), 'mask': padded['labels'] != -100}
    packed_logps = torch.cat([flat[b, :n] for b, n in enumerate(padded['row_lengths'])])[None]
    out_packed = {'logps': torch.where(packed['labels'] != -100, packed_logps, 0.0), 'mask': packed['labels'] != -100}
    loss = CrossEntropyLoss('sequence_mean')
    assert loss(padded, out_padded)['loss'].item() == pytest.approx(loss(packed, out_packed)['loss'].item())


def test_unknown_reduction_is_rejected():
    with pytest.raises(InvalidInputError, match="Unknown reduction 'mean'"):
        CrossEntropyLoss('mean')


def test_compute_logps_matches_log_softmax_in_values_and_gradients():
    torch.manual_seed(0)
    logits = torch.randn(2, 9, 37, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (2, 9))
    targets[0, :3] = -100
    ref = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    ref = torch.where(targets != -100, ref, 0.0)
    upstream = torch.randn(2, 9, dtype=torch.float64)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    for chunk in (1, 4, 1000):
        ours = compute_logps(logits, targets, chunk_tokens=chunk)
        (grad,) = torch.autograd.grad((ours * upstream).sum(), logits)
        torch.testing.assert_close(ours.double(), ref, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-6)
        assert grad[0, :3].abs().sum() == 0  # masked positions get no gradient


def test_logps_from_hidden_match_logits_path():
    torch.manual_seed(1)
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    weight = torch.randn(29, 8, requires_grad=True)
    targets = torch.randint(0, 29, (3, 5))
    targets[1, 2] = -100
    ref = compute_logps(hidden @ weight.T, targets)
    ref_grads = torch.autograd.grad(ref.sum(), [hidden, weight])
    ours, argmax = compute_logps_from_hidden(hidden, weight, targets, chunk_tokens=4)
    grads = torch.autograd.grad(ours.sum(), [hidden, weight])
    torch.testing.assert_close(ours, ref)
    assert torch.equal(argmax, (hidden @ weight.T).argmax(-1))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('lora', [True, False])
def test_chunked_loss_equals_plain_loss_on_a_real_model(tiny_model_dir, lora):
    rows = make_rows(2, lengths=(13, 7, 10))
    results = []
    for loss in (CrossEntropyLoss(), ChunkedCrossEntropyLoss(chunk_tokens=5)):
        torch.manual_seed(0)
        model = TransformersModel(tiny_model_dir)
        if lora:
            model.add_adapter_to_model('sft', {'r': 4, 'init_lora_weights': False})
        model.set_loss(loss)
        out = model.forward_backward(inputs=rows)
        grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.requires_grad}
        results.append((out, grads))
    (plain, plain_grads), (chunked, chunked_grads) = results
    assert chunked['loss'] == pytest.approx(plain['loss'], abs=1e-6)
    for a, b in zip(chunked['logprobs'], plain['logprobs']):
        assert a == pytest.approx(b, abs=1e-5)
    assert plain_grads.keys() == chunked_grads.keys()
    for name, grad in plain_grads.items():  # full fine-tuning includes the tied embedding / lm_head weight
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_chunked_loss_falls_back_to_logits_when_lm_head_is_adapted(tiny_model_dir, caplog):
    model = TransformersModel(tiny_model_dir)
    model.add_adapter_to_model('sft', {'r': 4, 'target_modules': ['q_proj', 'lm_head']})
    model.set_loss('ChunkedCrossEntropyLoss')
    rows = make_rows(3)
    with caplog.at_level(logging.WARNING):
        out = model.forward_backward(inputs=rows)
    assert 'computing full logits instead' in caplog.text
    model.set_loss('CrossEntropyLoss')
    assert model.forward_only(inputs=rows)['loss'] == pytest.approx(out['loss'], abs=1e-6)


def test_the_memory_bounded_path_is_chosen_by_the_batch_size_unless_the_loss_says():
    class Unset:  # a loss that does not say (GRPO, DPO, plain cross-entropy ...)
        pass

    vocab = 2048
    limit = forward.CHUNK_BYTES // (4 * vocab)  # tokens whose fp32 logits fill one chunk
    assert not forward.wants_hidden_state_logps(Unset(), limit, vocab)
    assert forward.wants_hidden_state_logps(Unset(), limit + 1, vocab)
    assert forward.wants_hidden_state_logps(ChunkedCrossEntropyLoss(), 1, vocab)  # says True
    full = CrossEntropyLoss()
    full.logps_from_hidden_states = False  # says False
    assert not forward.wants_hidden_state_logps(full, limit + 1, vocab)
    gkd = resolve('loss', 'GKDLoss')  # needs the logits, but takes hidden states and builds them in chunks
    assert not forward.wants_hidden_state_logps(gkd, limit, vocab)
    assert forward.wants_hidden_state_logps(gkd, limit + 1, vocab)

    class NeedsLogits:  # e.g. a custom loss reading outputs['logits']
        needs_logits = True
        logps_from_hidden_states = True

    assert not forward.wants_hidden_state_logps(NeedsLogits(), limit + 1, vocab)


@pytest.mark.parametrize(
    'loss_name,multi_lora',
    [('GRPOLoss', False), ('DPOLoss', False), ('GKDLoss', False), ('GKDLoss', True)],
    ids=['GRPOLoss', 'DPOLoss', 'GKDLoss', 'GKDLoss-multi-lora'],
)
def test_a_large_batch_takes_the_memory_bounded_path_with_the_same_gradients(
    tiny_model_dir, monkeypatch, loss_name, multi_lora
):
    from transformers import AutoModelForCausalLM

    from twinkle_core.loss.gkd import GKDLoss

    rows = make_rows(4, lengths=(13, 7, 10, 9))
    keywords = {'advantages': [1.0, -0.5, 0.25, -1.0]} if loss_name == 'GRPOLoss' else {}
    loss_kwargs = {
        'DPOLoss': {'reference_free': True},
        # GKD: the base model as teacher (the student's LoRA is not zero); its logits come in chunks too
        'GKDLoss': {'teacher_model': AutoModelForCausalLM.from_pretrained(tiny_model_dir), 'chunk_tokens': 5},
    }.get(loss_name, {})
    calls = []
    chunked = forward.compute_logps_from_hidden
    monkeypatch.setattr(forward, 'compute_logps_from_hidden', lambda *a, **k: calls.append(1) or chunked(*a, **k))
    teacher_logits = GKDLoss._run_teacher
    monkeypatch.setattr(GKDLoss, '_run_teacher', lambda *a: calls.append('full teacher') or teacher_logits(*a))
    results = []
    for chunk_bytes in (forward.CHUNK_BYTES, 4 * 2048 * 8):  # a chunk of 8 tokens: the batch is "large"
        monkeypatch.setattr(forward, 'CHUNK_BYTES', chunk_bytes)
        calls.clear()
        torch.manual_seed(0)
        model = (
            MultiLoraTransformersModel(tiny_model_dir, device='cpu')
            if multi_lora
            else TransformersModel(tiny_model_dir)
        )
        model.add_adapter_to_model('default', {'r': 4, 'init_lora_weights': False})
        adapter = {'adapter_name': 'default'} if multi_lora else {}
        model.set_loss(loss_name, **loss_kwargs, **adapter)
        out = model.forward_backward(inputs=rows, **keywords, **adapter)
        grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}
        results.append((out['loss'], grads, list(calls)))
    (plain, plain_grads, plain_calls), (bounded, bounded_grads, bounded_calls) = results
    # full logits for a small batch, chunks for a large one (GKD: the teacher's logits too)
    assert 1 not in plain_calls and 1 in bounded_calls and 'full teacher' not in bounded_calls
    assert plain_calls == (['full teacher'] if loss_name == 'GKDLoss' else [])
    assert abs(plain) > 1e-4  # a divergence / loss that is not zero
    assert bounded == pytest.approx(plain, abs=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(bounded_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_mixed_pass_needs_merge_the_tenants_choices():
    from twinkle_transformers.multi_lora.mixed_pass import _LossNeeds

    unset, chunked, full = CrossEntropyLoss(), ChunkedCrossEntropyLoss(), CrossEntropyLoss()
    full.logps_from_hidden_states = False
    assert _LossNeeds.of([unset, chunked]).logps_from_hidden_states is None  # the batch size decides
    assert _LossNeeds.of([chunked, chunked]).logps_from_hidden_states is True
    assert _LossNeeds.of([chunked, full]).logps_from_hidden_states is False
