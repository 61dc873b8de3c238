"""The model half of the backend seam, run against every installed model backend (TransformersModel,
MultiLoraTransformersModel, MegatronModel -- in this process, on its one-rank gloo group): `export_base` is the
checkpoint in Hugging Face names, `export_adapter` is a PEFT
adapter that plain PEFT loads and that scores exactly like the training model, and merging it into the exported
base (`merge_peft`) scores the same again. Reference: plain transformers / PEFT forwards, fp32, 1e-4."""

from __future__ import annotations

import json

import pytest
import torch

from tests.contract.implementations import installed, release, skip_unless_causal_lm
from twinkle_core.registry import resolve
from twinkle_core.weight_sync.weights import merge_peft

ROWS = [
    {'input_ids': [5, 6, 7, 8, 9, 10], 'labels': [-100, -100, 7, 8, 9, 10]},
    {'input_ids': [100, 200, 300, 400], 'labels': [-100, 200, 300, 400]},
]
ATOL = 1e-4


@pytest.fixture(scope='module', params=installed('model'))
def trained(request, tiny_model_dir):
    """A model of that backend with adapter 'policy' after two optimizer steps (so every LoRA tensor is non-zero)."""
    skip_unless_causal_lm(request.param)
    model = resolve('model', request.param, model_id=str(tiny_model_dir), device='cpu')
    model.add_adapter_to_model('policy', {'r': 4, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj', 'up_proj']})
    model.set_optimizer('AdamW', lr=2e-2, adapter_name='policy')
    for _ in range(2):
        model.forward_backward(inputs=ROWS, adapter_name='policy')
        model.clip_grad_and_step(adapter_name='policy')
    yield model
    release(model)


def model_logprobs(model) -> list[torch.Tensor]:
    out = model.forward_only(inputs=ROWS, compute_loss=False, adapter_name='policy')['logprobs']
    return [torch.tensor(row[1:]) for row in out]


def hf_logprobs(module) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for row in ROWS:
            ids = row['input_ids']
            logits = module(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            out.append(logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0])
    return out


def test_adapters_and_base_training_are_declared(trained):
    assert trained.list_adapters() == ['policy'] and trained.trains_base() is False
    assert trained.is_export_rank()


def test_export_base_is_the_checkpoint_in_hugging_face_names(trained, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    exported = {n: t for bucket in trained.export_base(bucket_bytes=1 << 16) for n, t in bucket}
    assert exported.keys() == reference.keys()
    assert all(torch.equal(exported[n], reference[n]) for n in reference)
    layout = trained.weight_layout()
    assert {n: s for n, (_, s) in layout.items()} == {n: tuple(t.shape) for n, t in reference.items()}


def test_the_exported_adapter_loads_in_plain_peft_and_scores_like_the_model(trained, tiny_model_dir, tmp_path):
    import peft
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    config, buckets = trained.export_adapter('policy', bucket_bytes=4096)
    tensors = {n: t.detach().clone() for bucket in buckets for n, t in bucket}
    assert tensors and all('.lora_A.' in n or '.lora_B.' in n for n in tensors)
    save_file(tensors, str(tmp_path / 'adapter_model.safetensors'))
    (tmp_path / 'adapter_config.json').write_text(json.dumps(config))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(base, tmp_path).eval()
    for got, want in zip(model_logprobs(trained), hf_logprobs(reference)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_merged_weights_score_like_the_unmerged_model(trained, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    config, buckets = trained.export_adapter('policy')
    adapter = {n: t for bucket in buckets for n, t in bucket}
    merged = {n: t for bucket in merge_peft(trained.export_base(), config, adapter) for n, t in bucket}
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    plain.load_state_dict(merged)
    unmerged = model_logprobs(trained)
    for got, want in zip(hf_logprobs(plain), unmerged):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    base_only = hf_logprobs(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval())
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(base_only, unmerged))  # the adapter matters


def test_update_optimizer_changes_hyper_parameters_and_refuses_unknown_ones(trained):
    from twinkle_core.errors import InvalidInputError

    def adapter_tensors():
        _, buckets = trained.export_adapter('policy')
        return {n: t.detach().clone() for bucket in buckets for n, t in bucket}

    before = adapter_tensors()
    trained.update_optimizer(lr=0.0, weight_decay=0.0, adapter_name='policy')
    trained.forward_backward(inputs=ROWS, adapter_name='policy')
    trained.clip_grad_and_step(adapter_name='policy')
    assert all(torch.equal(before[n], t) for n, t in adapter_tensors().items())  # lr 0: nothing moves
    with pytest.raises(InvalidInputError, match=r"no hyper-parameter\(s\) \['learning_rate'\]"):
        trained.update_optimizer(learning_rate=1e-3, adapter_name='policy')
    trained.update_optimizer(lr=2e-2, adapter_name='policy')


def test_gradients_equal_plain_peft_on_the_same_weights(trained, tiny_model_dir, tmp_path):
    """One SGD step with lr=1 moves each LoRA tensor by exactly minus its gradient: the backend's gradient of the
    default loss (token-mean cross-entropy over the batch's label tokens) equals plain PEFT's on the same weights."""
    import peft
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    def adapter_tensors():
        config, buckets = trained.export_adapter('policy')
        return config, {n: t.detach().clone() for bucket in buckets for n, t in bucket}

    config, before = adapter_tensors()
    save_file(before, str(tmp_path / 'adapter_model.safetensors'))
    (tmp_path / 'adapter_config.json').write_text(json.dumps(config))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(base, tmp_path, is_trainable=True).eval()
    total, count = torch.zeros(()), 0
    for row in ROWS:
        logps = reference(input_ids=torch.tensor([row['input_ids']])).logits[0, :-1].float().log_softmax(-1)
        labels = torch.tensor(row['labels'][1:])
        mask = labels != -100
        total = total - logps[mask].gather(-1, labels[mask][:, None]).sum()
        count += int(mask.sum())
    (total / count).backward()
    expected = {n.replace('.default', ''): p.grad for n, p in reference.named_parameters() if p.requires_grad}

    trained.set_optimizer('SGD', lr=1.0, adapter_name='policy')
    try:
        trained.forward_backward(inputs=ROWS, adapter_name='policy')
        trained.clip_grad_and_step(max_norm=None, adapter_name='policy')
        _, after = adapter_tensors()
    finally:
        trained.set_optimizer('AdamW', lr=2e-2, adapter_name='policy')
    assert expected.keys() == before.keys()
    assert any(g.abs().max() > 1e-4 for g in expected.values())  # a comparison of zeros would prove nothing
    for name, grad in expected.items():
        torch.testing.assert_close(before[name] - after[name], grad, atol=2e-6, rtol=1e-4, msg=name)


def test_a_second_adapter_leaves_the_first_as_it_was(trained):
    """A backend that declares room for several adapters trains a second one without touching the first, and
    removing it gives the first back alone (runs last: it restores the shared fixture)."""
    if trained.capabilities.max_adapters is not None and trained.capabilities.max_adapters < 2:
        pytest.skip(f'{type(trained).__name__} declares max_adapters={trained.capabilities.max_adapters}')
    before = model_logprobs(trained)
    trained.add_adapter_to_model('other', {'r': 2, 'lora_alpha': 4, 'init_lora_weights': False})
    trained.set_optimizer('AdamW', lr=5e-2, adapter_name='other')
    other_before = trained.forward_backward(inputs=ROWS, adapter_name='other')['logprobs']
    trained.clip_grad_and_step(adapter_name='other')
    assert trained.list_adapters() == ['policy', 'other']
    for got, want in zip(model_logprobs(trained), before):
        assert torch.equal(got, want)
    other_after = trained.forward_only(inputs=ROWS, compute_loss=False, adapter_name='other')['logprobs']
    assert other_after != other_before  # the second adapter did train
    trained.remove_adapter('other')
    assert trained.list_adapters() == ['policy']
    for got, want in zip(model_logprobs(trained), before):
        assert torch.equal(got, want)
