"""Vision-language training on the tiny Qwen3-VL / Qwen3.5 fixtures: layouts, LoRA, save/load, multi-tenant."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.fixtures.images import colour_trajectories
from twinkle_core.processor.causal_lm import CausalLMProcessor
from twinkle_core.template.vision import VisionTemplate

pytest.importorskip('peft')
from twinkle_transformers.forward import forward_logps  # noqa: E402
from twinkle_transformers.model import TransformersModel  # noqa: E402

TEXT_ROW = {'messages': [{'role': 'user', 'content': 'Say hello.'}, {'role': 'assistant', 'content': 'hello'}]}
LORA = {'r': 8, 'lora_alpha': 16}


@pytest.fixture(scope='module')
def template(tiny_vl_model_dir):
    return VisionTemplate(tiny_vl_model_dir)


@pytest.fixture(scope='module')
def rows(template):
    """Three image rows of different sizes (so different token counts) and one text-only row."""
    trajectories = colour_trajectories(3)
    encoded = [template.encode(t) for t in trajectories]
    wide = dict(trajectories[0])
    from twinkle_core.fixtures.images import colour_image

    wide['images'] = [colour_image('blue', (160, 96))]
    encoded.append(template.encode(wide))
    encoded.append(template.encode(TEXT_ROW))
    return encoded


def _train(model, rows, steps: int) -> list[float]:
    """`steps` optimizer steps on `rows`; the loss of each."""
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(inputs=rows)['loss'])
        model.clip_grad_and_step()
    return losses


def _row_logps(model, rows, padding_free):
    batch = CausalLMProcessor(padding_free=padding_free)(rows)
    with torch.no_grad():
        logps = forward_logps(model, batch)['target_logps']
    if padding_free:
        return torch.split(logps[0, : batch['num_tokens']], batch['row_lengths'])
    return [logps[i, :n] for i, n in enumerate(batch['row_lengths'])]


def test_packed_equals_padded_equals_separate(tiny_vl_model_dir, rows) -> None:
    model = TransformersModel(tiny_vl_model_dir).model.eval()
    padded = _row_logps(model, rows, padding_free=False)
    packed = _row_logps(model, rows, padding_free=True)
    separate = [_row_logps(model, [row], padding_free=False)[0] for row in rows]
    for a, b, c in zip(padded, packed, separate):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
        assert torch.allclose(a, c, atol=1e-5), (a - c).abs().max()


def test_image_changes_the_answer_logprobs(tiny_vl_model_dir, template) -> None:
    model = TransformersModel(tiny_vl_model_dir).model.eval()
    red, green = colour_trajectories(2)
    green = {**green, 'messages': red['messages']}  # same text, other image
    a, b = (template.encode(t) for t in (red, green))
    assert a['input_ids'] == b['input_ids']
    la, lb = (_row_logps(model, [r], False)[0] for r in (a, b))
    assert (la - lb).abs().max() > 1e-4


def test_lora_sft_learns_and_stays_off_the_vision_tower(tiny_vl_model_dir, rows) -> None:
    model = TransformersModel(tiny_vl_model_dir)
    model.add_adapter_to_model('default', LORA)
    adapted = [n for n, _ in model.model.named_modules() if n.endswith('.lora_A')]
    assert adapted and not any('.visual.' in n for n in adapted)
    model.set_optimizer('AdamW', lr=1e-2)
    losses = _train(model, rows, 12)
    assert losses[-1] < losses[0] - 1.0, losses


@pytest.mark.parametrize(
    'group, on_vision, on_language', [('vision', True, False), ('all', True, True), ('language', False, True)]
)
def test_lora_target_groups(tiny_vl_model_dir, rows, group, on_vision, on_language) -> None:
    model = TransformersModel(tiny_vl_model_dir)
    model.add_adapter_to_model('default', {**LORA, 'target_modules': group})
    adapted = [n for n, _ in model.model.named_modules() if n.endswith('.lora_A')]
    assert any('.visual.' in n for n in adapted) == on_vision
    assert any('.language_model.' in n for n in adapted) == on_language
    model.set_optimizer('AdamW', lr=1e-3)
    model.forward_backward(inputs=rows[:2])
    model.clip_grad_and_step()


def test_vision_group_on_a_text_model_is_an_error(tiny_model_dir) -> None:
    model = TransformersModel(tiny_model_dir)
    with pytest.raises(InvalidInputError, match='vision-language'):
        model.add_adapter_to_model('default', {**LORA, 'target_modules': 'vision'})


def test_full_finetuning_with_a_frozen_vision_tower(tiny_vl_model_dir, rows) -> None:
    model = TransformersModel(tiny_vl_model_dir, freeze_vision_tower=True)
    visual = {n: p.detach().clone() for n, p in model.model.named_parameters() if '.visual.' in n}
    language = {n: p.detach().clone() for n, p in model.model.named_parameters() if '.language_model.' in n}
    model.set_optimizer('AdamW', lr=1e-3)
    model.forward_backward(inputs=rows)
    model.clip_grad_and_step()
    after = dict(model.model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in visual.items())
    assert any(not torch.equal(after[n], v) for n, v in language.items())


def test_lora_save_loads_in_plain_transformers_and_peft(tiny_vl_model_dir, rows, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    model = TransformersModel(tiny_vl_model_dir)
    model.add_adapter_to_model('default', LORA)
    model.set_optimizer('AdamW', lr=1e-2)
    for _ in range(3):
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step()
    path = model.save('vl-lora', output_dir=str(tmp_path), save_optimizer=True)
    ours = _row_logps(model.model.eval(), rows, False)
    plain = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir), path).eval()
    theirs = _row_logps(plain, rows, False)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, atol=1e-5)
    # resume is exact: one more step from the checkpoint equals one more step of the original
    model.model.train()
    resumed = TransformersModel(tiny_vl_model_dir)
    resumed.load(path, load_optimizer=True)
    a = model.forward_backward(inputs=rows)['loss']
    model.clip_grad_and_step()
    b = resumed.forward_backward(inputs=rows)['loss']
    resumed.clip_grad_and_step()
    assert a == pytest.approx(b, abs=1e-6)


def test_full_save_is_a_complete_vl_checkpoint(tiny_vl_model_dir, rows, tmp_path) -> None:
    from transformers import AutoModelForImageTextToText

    model = TransformersModel(tiny_vl_model_dir)
    model.set_optimizer('AdamW', lr=1e-3)
    model.forward_backward(inputs=rows)
    model.clip_grad_and_step()
    path = model.save('vl-full', output_dir=str(tmp_path))
    again = AutoModelForImageTextToText.from_pretrained(path).eval()
    for a, b in zip(_row_logps(model.model.eval(), rows, False), _row_logps(again, rows, False)):
        assert torch.allclose(a, b, atol=1e-5)
    assert VisionTemplate(path).encode(colour_trajectories(1)[0])['input_ids'] == rows[0]['input_ids']


def test_images_on_a_text_model_are_refused(tiny_model_dir, rows) -> None:
    model = TransformersModel(tiny_model_dir)
    with pytest.raises(InvalidInputError, match='text-only'):
        model.forward_only(inputs=rows[:1])


def test_images_without_a_model_name_the_missing_model() -> None:
    """`model_call_kwargs(batch)` without model= cannot build image inputs; it used to blame a 'NoneType' model."""
    from twinkle_transformers.forward import model_call_kwargs

    batch = {'input_ids': torch.ones(1, 4, dtype=torch.long), 'position_ids': torch.arange(4)[None]}
    assert model_call_kwargs(batch)['input_ids'] is batch['input_ids']
    with pytest.raises(InvalidInputError, match='no model was given: pass model='):
        model_call_kwargs({**batch, 'pixel_values': torch.zeros(4, 8)})


def test_qwen3_5_trains_padded_and_refuses_packing(tiny_qwen3_5_model_dir) -> None:
    template = VisionTemplate(tiny_qwen3_5_model_dir)
    rows = [template.encode(t) for t in colour_trajectories(3)] + [template.encode(TEXT_ROW)]
    model = TransformersModel(tiny_qwen3_5_model_dir)
    padded = _row_logps(model.model.eval(), rows, False)
    separate = [_row_logps(model.model, [row], False)[0] for row in rows]
    for a, b in zip(padded, separate):
        assert torch.allclose(a, b, atol=1e-5)
    model.model.train()
    model.add_adapter_to_model('default', LORA)
    model.set_optimizer('AdamW', lr=1e-2)
    losses = _train(model, rows, 8)
    assert losses[-1] < losses[0]
    model.set_processor('CausalLMProcessor', padding_free=True)
    with pytest.raises(InvalidInputError, match='linear-attention'):
        model.forward_backward(inputs=rows)


def test_mixed_text_and_image_tenants_stay_isolated(tiny_vl_model_dir, rows) -> None:
    """One multi-tenant pass (image tenant + text tenant) equals each tenant trained alone."""
    from twinkle_transformers.multi_lora.model import MultiLoraTransformersModel

    batches = {'image': rows[:3], 'text': [rows[4], rows[4]]}

    def run(tenants):
        model = MultiLoraTransformersModel(tiny_vl_model_dir)
        for name in tenants:
            model.add_adapter_to_model(name, LORA, generator=torch.Generator().manual_seed(7))
            model.set_optimizer('AdamW', lr=1e-2, adapter_name=name)
        for _ in range(2):
            model.forward_backward(inputs={name: batches[name] for name in tenants})
            for name in tenants:
                model.clip_grad_and_step(adapter_name=name)
        out = model.forward_only(inputs={name: batches[name] for name in tenants})
        return {name: out[name]['loss'] for name in tenants}

    together = run(['image', 'text'])
    alone = {**run(['image']), **run(['text'])}
    for name in together:
        assert together[name] == pytest.approx(alone[name], abs=1e-5), name


@pytest.mark.gpu
def test_vl_training_on_cuda(tiny_vl_model_dir, rows) -> None:
    """On a GPU: fp32 packed == padded (1e-4: CUDA kernels), and bf16 LoRA training (the GPU default) learns."""
    if not torch.cuda.is_available():
        pytest.skip('needs CUDA')
    model = TransformersModel(tiny_vl_model_dir, device='cuda', dtype='float32').model.eval()
    batches = [CausalLMProcessor(padding_free=p)(rows, device='cuda') for p in (False, True)]
    with torch.no_grad():
        padded, packed = (forward_logps(model, b)['target_logps'] for b in batches)
    flat = torch.cat([padded[i, :n] for i, n in enumerate(batches[0]['row_lengths'])])
    assert torch.allclose(flat, packed[0, : flat.numel()], atol=1e-4)
    trained = TransformersModel(tiny_vl_model_dir)  # bf16 on CUDA
    assert trained.dtype == torch.bfloat16
    trained.add_adapter_to_model('default', LORA)
    trained.set_optimizer('AdamW', lr=1e-2)
    losses = _train(trained, rows, 12)
    assert losses[-1] < losses[0] - 1.0, losses


@pytest.mark.slow
@pytest.mark.learning
def test_sft_vl_example_learns_the_colours(tmp_path) -> None:
    """examples/sft_vl.py as a user runs it: held-out colour accuracy goes from chance to (nearly) all right."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / 'examples' / 'sft_vl.py'
    done = subprocess.run(
        [sys.executable, str(example), '--data-dir', str(tmp_path / 'data'), '--output-dir', str(tmp_path / 'out')],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = (float(x) for x in re.findall(r'accuracy (?:before|after): ([0-9.]+)', done.stdout))
    assert after >= 0.75 and after > before, done.stdout
    assert (tmp_path / 'out' / 'final' / 'adapter_model.safetensors').exists()
