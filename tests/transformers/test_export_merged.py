"""`twinkle export --merge`: a LoRA checkpoint saved by `TransformersModel` becomes one plain Hugging Face model
directory whose logits, in plain transformers without peft, equal the adapter on the base (1e-4); a full checkpoint
is exported as it is; bad input says what is wrong and leaves an existing output untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinkle_core.cli.main import main
from twinkle_core.errors import InvalidInputError

pytest.importorskip('twinkle_transformers')


@pytest.fixture(scope='module')
def adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA checkpoint after two steps (so its B matrices are not zero), as `model.save` writes it."""
    from twinkle_core.model import TransformersModel

    model = TransformersModel(model_id=tiny_model_dir)
    model.add_adapter_to_model('default', {'r': 4, 'lora_alpha': 8, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=1e-2)
    rows = [{'input_ids': [5, 6, 7, 8, 9, 10], 'labels': [-100, -100, 7, 8, 9, 10]}] * 2
    for _ in range(2):
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step()
    return model.save('step-2', output_dir=str(tmp_path_factory.mktemp('run')))


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_the_merged_model_gives_the_adapter_s_logits_in_plain_transformers(tiny_model_dir, adapter, tmp_path, capsys):
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / 'merged'
    assert main(['export', str(adapter), str(out), '--merge']) == 0
    assert 'merged into its base model' in capsys.readouterr().out
    files = {p.name for p in out.iterdir()}
    assert 'config.json' in files and 'adapter_config.json' not in files and 'training_state.pt' not in files
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any('lora' in name for name, _ in merged.named_parameters())
    reference = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = [3, 17, 5, 6, 7, 8, 9, 10, 42]
    torch.testing.assert_close(logits_of(merged, ids), logits_of(reference, ids), rtol=1e-4, atol=1e-4)
    assert (logits_of(merged, ids) - logits_of(base, ids)).abs().max() > 1e-3  # the adapter did change something
    assert AutoTokenizer.from_pretrained(out).encode('hello') == AutoTokenizer.from_pretrained(tiny_model_dir).encode(
        'hello'
    )


def test_bfloat16_and_a_base_given_by_flag(tiny_model_dir, adapter, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / 'merged-bf16'
    assert (
        main(['export', str(adapter), str(out), '--merge', '--base', str(tiny_model_dir), '--dtype', 'bfloat16']) == 0
    )
    assert json.loads((out / 'config.json').read_text())['dtype'] == 'bfloat16'
    assert next(AutoModelForCausalLM.from_pretrained(out).parameters()).dtype == torch.bfloat16


def test_a_full_checkpoint_is_exported_as_it_is(tiny_model_dir, tmp_path):
    from twinkle_transformers.merge import export_merged

    out = export_merged(tiny_model_dir, tmp_path / 'full')
    assert (tmp_path / 'full' / 'config.json').exists() and out == str(tmp_path / 'full')


def test_bad_input_says_what_is_wrong_and_keeps_an_existing_output(adapter, tmp_path, capsys):
    from twinkle_transformers.merge import export_merged

    out = tmp_path / 'kept'
    out.mkdir()
    (out / 'precious.txt').write_text('keep me')
    orphan = tmp_path / 'orphan'
    orphan.mkdir()
    config = json.loads((Path(adapter) / 'adapter_config.json').read_text())
    (orphan / 'adapter_config.json').write_text(
        json.dumps({**config, 'base_model_name_or_path': str(tmp_path / 'gone')})
    )
    with pytest.raises(InvalidInputError, match='is not a local Hugging Face model directory.*--base DIR'):
        export_merged(orphan, out)
    assert main(['export', str(tmp_path / 'missing'), str(out), '--merge']) == 1
    assert 'does not exist' in capsys.readouterr().err
    assert (out / 'precious.txt').read_text() == 'keep me'
