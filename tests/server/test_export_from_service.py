"""`twinkle server export`: a checkpoint trained and saved through the unmodified tinker SDK leaves the service's
store as one plain Hugging Face model (`--merge`) whose logits in plain transformers equal the adapter on the base
(1e-4), or as its PEFT files; a path the store does not hold, or a malformed one, is a clear error."""

from __future__ import annotations

import torch
from server_names import MODEL

from twinkle_core.cli.main import main


def test_a_tinker_checkpoint_exports_merged_and_as_peft_files(server, service_client, sft_data, tmp_path, capsys):
    import peft
    from tinker import types
    from transformers import AutoModelForCausalLM

    training = service_client.create_lora_training_client(base_model=MODEL, rank=4)
    for _ in range(2):
        training.forward_backward(sft_data, 'cross_entropy').result()
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = training.save_state('exported').result().path
    assert path.startswith('tinker://')
    store = ['--data-dir', str(server.data_dir)]

    merged_dir, peft_dir = tmp_path / 'merged', tmp_path / 'adapter'
    assert main(['server', 'export', path, str(merged_dir), '--merge', *store]) == 0
    assert main(['server', 'export', path, str(peft_dir), *store]) == 0
    assert (peft_dir / 'adapter_config.json').exists() and not (merged_dir / 'adapter_config.json').exists()

    ids = torch.tensor([sft_data[0].model_input.to_ints()])
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(server.model_dir), peft_dir)
    base = AutoModelForCausalLM.from_pretrained(server.model_dir)
    with torch.no_grad():
        got, want = merged(input_ids=ids).logits, reference(input_ids=ids).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert (got - base(input_ids=ids).logits).abs().max() > 1e-3  # the training did change the model

    capsys.readouterr()
    run_id = path.removeprefix('tinker://').split('/')[0]
    missing = f'tinker://{run_id}/weights/never-saved'
    assert main(['server', 'export', missing, str(tmp_path / 'x'), *store]) == 1
    assert f'no checkpoint {missing} in this store' in capsys.readouterr().err
    assert main(['server', 'export', 'tinker://just-a-run', str(tmp_path / 'x'), *store]) == 2
    assert 'invalid checkpoint path' in capsys.readouterr().err
    assert not (tmp_path / 'x').exists()
