"""TransformersModel checkpoints: bit-exact resume (LoRA and full), PEFT/HF loadability, extra state."""

from __future__ import annotations

import pytest
import torch
from row_helpers import labelled_rows

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.model import TransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')

LORA = {'r': 4, 'lora_alpha': 8, 'lora_dropout': 0.1}  # dropout: the resume must restore the RNG too


def rows_for_step(step: int) -> list[dict]:
    return labelled_rows(1000 + step, lengths=(7, 12, 9), prompt=2)


def train(model: TransformersModel, start: int, steps: int) -> list[float]:
    losses = []
    for step in range(start, start + steps):
        losses.append(model.forward_backward(inputs=rows_for_step(step))['loss'])
        model.clip_grad_and_step(max_norm=1.0)
    return losses


def trainable(model: TransformersModel) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.model.named_parameters() if p.requires_grad}


class CountingLoader:
    """Stands in for a resumable data loader: only its state_dict/load_state_dict matter here."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {'position': self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state['position']


def test_lora_resume_is_bit_exact(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    model = TransformersModel(tiny_model_dir)
    model.add_adapter_to_model('sft', LORA, gradient_accumulation_steps=1)
    model.set_optimizer('AdamW', lr=5e-3, weight_decay=0.01)
    model.set_lr_scheduler('CosineWarmupScheduler', num_warmup_steps=3, num_training_steps=20, min_lr_ratio=0.1)
    train(model, 0, 10)
    loader = CountingLoader()
    loader.position = 10
    path = model.save(
        'step-10', output_dir=str(tmp_path), save_optimizer=True, dataloader=loader, extra_state={'epoch': 0}
    )
    continued = train(model, 10, 10)
    expected = trainable(model)

    torch.manual_seed(123)  # a different process state: everything must come from the checkpoint
    resumed = TransformersModel(tiny_model_dir)
    fresh_loader = CountingLoader()
    extra = resumed.load(path, load_optimizer=True, dataloader=fresh_loader)  # adapter, optimizer, scheduler rebuilt
    assert extra == {'epoch': 0} and fresh_loader.position == 10
    assert resumed.adapter_name == 'sft' and resumed.state.optimizer_steps == 10
    assert train(resumed, 10, 10) == continued  # exact float equality, step by step
    got = trainable(resumed)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[n], expected[n]) for n in expected)
    assert resumed.state.current_lr() == model.state.current_lr()


def test_full_resume_is_bit_exact(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    model = TransformersModel(tiny_model_dir)
    model.set_optimizer('AdamW', lr=1e-3)
    model.set_lr_scheduler('LinearWarmupScheduler', num_warmup_steps=2, num_training_steps=10)
    train(model, 0, 5)
    path = model.save('full', output_dir=str(tmp_path), save_optimizer=True)
    continued = train(model, 5, 5)
    expected = trainable(model)

    resumed = TransformersModel(tiny_model_dir)
    resumed.set_optimizer('AdamW', lr=1e-3)  # set explicitly, as a user script would; state comes from the file
    resumed.set_lr_scheduler('LinearWarmupScheduler', num_warmup_steps=2, num_training_steps=10)
    resumed.load(path, load_optimizer=True)
    assert train(resumed, 5, 5) == continued
    got = trainable(resumed)
    assert all(torch.equal(got[n], expected[n]) for n in expected)


def test_saved_lora_loads_with_plain_peft(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = TransformersModel(tiny_model_dir)
    model.add_adapter_to_model('sft', {'r': 4, 'lora_alpha': 8})
    model.set_optimizer('AdamW', lr=1e-2)
    train(model, 0, 3)
    path = model.save('adapter', output_dir=str(tmp_path))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), path).eval()
    ids = torch.tensor([rows_for_step(0)[1]['input_ids']])
    model.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(input_ids=ids).logits, model.model(input_ids=ids).logits)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
    assert not torch.allclose(base, peft_model(input_ids=ids).logits)  # the adapter is really applied


def test_saved_full_model_loads_with_transformers(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = TransformersModel(tiny_model_dir)
    model.set_optimizer('SGD', lr=0.5)
    train(model, 0, 2)
    path = model.save('full', output_dir=str(tmp_path))
    model.save('full', output_dir=str(tmp_path))  # overwriting an existing checkpoint works
    reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
    assert AutoTokenizer.from_pretrained(path).eos_token == '<|im_end|>'
    ids = torch.tensor([rows_for_step(0)[0]['input_ids']])
    model.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model.model(input_ids=ids).logits)


def test_loading_optimizer_state_that_was_not_saved_is_a_clear_error(tiny_model_dir, tmp_path):
    model = TransformersModel(tiny_model_dir)
    model.add_adapter_to_model('sft', {'r': 4})
    path = model.save('weights-only', output_dir=str(tmp_path))
    with pytest.raises(InvalidInputError, match='saved without save_optimizer=True'):
        TransformersModel(tiny_model_dir).load(path, load_optimizer=True)
    with pytest.raises(InvalidInputError, match='not a checkpoint'):
        model.load(str(tmp_path))
