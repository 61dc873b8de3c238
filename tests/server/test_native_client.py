"""The native client (twinkle-client, no torch): remote MultiLoraTransformersModel / TorchSampler, save + resume."""

from __future__ import annotations

import subprocess
import sys

import pytest
from server_names import MODEL


@pytest.fixture(scope='module')
def client(server, alice):
    from twinkle_client import init_twinkle_client

    c = init_twinkle_client(base_url=server.base_url, api_key=alice)
    yield c
    c.close()


@pytest.fixture(scope='module')
def rows(tokenizer):
    out = []
    for text in ('User: Who are you?\nAssistant: I am twinkle.', 'User: Say hi.\nAssistant: Hi there!'):
        ids = tokenizer.encode(text)
        out.append({'input_ids': ids, 'labels': [-100] + ids[1:]})
    return out


def _step(model, rows, name) -> float:
    loss = model.forward_backward(inputs=rows, adapter_name=name)['loss']
    model.clip_grad_and_step(adapter_name=name)
    return loss


def test_train_save_and_resume_in_a_new_client(server, alice, client, rows):
    from twinkle_client import MultiLoraTransformersModel, TwinkleClient

    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('mine', {'r': 4, 'lora_alpha': 8, 'seed': 0})
    model.set_optimizer('AdamW', lr=1e-2, adapter_name='mine')
    model.set_lr_scheduler(scheduler_cls='StepLR', step_size=100, adapter_name='mine')  # Twinkle's spelling
    losses = [_step(model, rows, 'mine') for _ in range(4)]
    assert losses[-1] < losses[0]
    path = model.save('native-ck', save_optimizer=True, adapter_name='mine')
    assert path.startswith('twinkle://') and path.endswith('/weights/native-ck')
    expected = [_step(model, rows, 'mine') for _ in range(2)]

    other = TwinkleClient(server.base_url, alice)  # as a new process would
    resumed = MultiLoraTransformersModel(model_id=MODEL, client=other)
    resumed.load(path, load_optimizer=True, adapter_name='again')
    assert [_step(resumed, rows, 'again') for _ in range(2)] == pytest.approx(expected, rel=1e-5)

    run_id = model.server_model_id('mine')
    assert run_id in {r['training_run_id'] for r in client.list_training_runs()}
    assert path.replace('twinkle://', 'tinker://') in {c['tinker_path'] for c in client.list_checkpoints(run_id)}
    assert 'adapter' in model.get_train_configs(adapter_name='mine')


def test_remote_sampler_samples_from_a_checkpoint(client, rows):
    from twinkle_client import MultiLoraTransformersModel, TorchSampler
    from twinkle_core.types import SampleResponse

    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('s', {'r': 4})
    path = model.save('for-sampling', adapter_name='s')
    sampler = TorchSampler(model_id=MODEL)
    out = sampler.sample(
        [{'input_ids': rows[0]['input_ids'][:6]}], {'max_tokens': 4, 'num_samples': 2, 'seed': 3}, adapter_name=path
    )
    assert isinstance(out[0], SampleResponse) and len(out[0].sequences) == 2
    assert all(len(s.logprobs) == len(s.tokens) for s in out[0].sequences)
    base = sampler.sample([{'input_ids': rows[0]['input_ids'][:6]}], {'max_tokens': 4, 'seed': 3})
    assert len(base[0].sequences) == 1


def test_the_runtime_modes_client_training_loop(client, rows):
    """Runtime-modes document, "Client Training": `sampler.sample(inputs=batch, sampling_params=params)` then
    `model.forward_backward(inputs=responses, advantages=advantages)` and `model.step()` -- the sampler's results
    train as their samples' rows (one advantage per sample, in order), through the native client."""
    from twinkle_client.model import MultiLoraTransformersModel
    from twinkle_client.sampler import vLLMSampler  # the documents' name: whatever sampler the server runs

    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('default', {'r': 4, 'lora_alpha': 8})
    model.set_optimizer('AdamW', lr=1e-3)
    model.set_loss('GRPOLoss')
    sampler = vLLMSampler(model_id=MODEL)
    batch = [{'input_ids': r['input_ids'][:6]} for r in rows]
    responses = sampler.sample(inputs=batch, sampling_params={'max_tokens': 4, 'num_samples': 2, 'seed': 1})
    samples = [s for r in responses for s in r.sequences]
    assert len(samples) == 4 and all(s.new_input_feature for s in samples)
    rows_of_samples = [s.new_input_feature for s in samples]
    advantages = [1.0, -1.0, 0.5, -0.5]
    before = model.forward_only(inputs=rows_of_samples, compute_loss=False)['logprobs']
    first = model.forward_backward(inputs=responses, advantages=advantages)
    for got, want in zip(first['logprobs'], before, strict=True):  # the responses trained as their samples' rows,
        assert got == pytest.approx(want, abs=1e-5)  # in order
    model.step()
    model.zero_grad()
    after = model.forward_only(inputs=rows_of_samples, compute_loss=False)['logprobs']
    # GRPO on-policy ascends sum_i A_i log p(sample_i): the step raised it
    gain = sum(a * (sum(y[-4:]) - sum(x[-4:])) for a, x, y in zip(advantages, before, after))
    assert gain > 0
    with pytest.raises(Exception, match='4 rows'):  # advantages count samples, not responses
        model.forward_backward(inputs=responses, advantages=[1.0, -1.0])


def test_refusals_are_clear(client, rows):
    from twinkle_client import MultiLoraTransformersModel, RemoteInputError

    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('r', {'r': 2})
    with pytest.raises(RemoteInputError, match='hub reference'):
        model.set_loss('ms://someone/evil-loss', adapter_name='r')
    with pytest.raises(RemoteInputError, match='not a remote Model method'):
        client.conn.post(f'/twinkle/v1/models/{model.server_model_id("r")}/call/__init__', {})
    with pytest.raises(RemoteInputError, match='row 0'):
        model.forward_backward(inputs=[{'input_ids': [5, 6], 'labels': [1]}], adapter_name='r')
    assert model.forward_backward(inputs=rows, adapter_name='r')['loss'] > 0  # still serving


def test_client_package_does_not_import_torch():
    code = 'import sys, twinkle_client; assert "torch" not in sys.modules, "torch imported"'
    subprocess.run([sys.executable, '-c', code], check=True)


def test_http_runtime_turns_the_local_class_into_its_remote_twin(server, alice, rows):
    """`initialize(mode='http')` + `remote_group=` builds the proxy: the training script itself is unchanged."""
    from twinkle_core.runtime import initialize, shutdown
    from twinkle_transformers.multi_lora.model import MultiLoraTransformersModel as LocalModel

    initialize(mode='http', base_url=server.base_url, api_key=alice)
    try:
        model = LocalModel(model_id=MODEL, remote_group='train')
        assert type(model).__module__ == 'twinkle_client.remote'
        model.add_adapter_to_model('rt', {'r': 2})
        assert model.forward_backward(inputs=rows, adapter_name='rt')['loss'] > 0
    finally:
        shutdown()
