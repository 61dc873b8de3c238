"""The unmodified `tinker` SDK against a real twinkle server: SFT, RL, resume, custom losses, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker
from server_names import MODEL
from tinker import types

ADAM = types.AdamParams(learning_rate=5e-3)


def _train(tc, data, steps: int, adam=ADAM) -> list[float]:
    losses = []
    for _ in range(steps):
        fwd = tc.forward_backward(data, 'cross_entropy')
        opt = tc.optim_step(adam)
        losses.append(fwd.result().metrics['loss:sum'])
        opt.result()
    return losses


def _loss(tc, data) -> float:
    return tc.forward(data, 'cross_entropy').result().metrics['loss:sum']


def test_sft_loss_falls_and_logprobs_match_loss(service_client, sft_data):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    losses = _train(tc, sft_data, 6)
    assert losses[-1] < 0.8 * losses[0], losses
    out = tc.forward(sft_data, 'cross_entropy').result()
    # loss:sum is exactly -sum(weights * logprobs) of the returned per-token logprobs
    expected = -sum(
        float(np.dot(o['logprobs'].to_numpy(), d.loss_fn_inputs['weights'].to_numpy()))
        for o, d in zip(out.loss_fn_outputs, sft_data)
    )
    assert out.metrics['loss:sum'] == pytest.approx(expected, rel=1e-4)
    assert all(len(o['logprobs'].tolist()) == d.model_input.length for o, d in zip(out.loss_fn_outputs, sft_data))


def test_adam_params_are_honoured(service_client, sft_data):
    """lr=0 must leave the weights unchanged; a positive lr must change them."""
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
    _train(tc, sft_data, 1)  # move LoRA B off zero so later steps are visible
    before = _loss(tc, sft_data)
    _train(tc, sft_data, 1, types.AdamParams(learning_rate=0.0))
    assert _loss(tc, sft_data) == pytest.approx(before, rel=1e-6)
    _train(tc, sft_data, 1, types.AdamParams(learning_rate=1e-2, weight_decay=0.1, grad_clip_norm=1.0))
    assert _loss(tc, sft_data) != pytest.approx(before, rel=1e-4)


def test_save_state_resume_gives_identical_next_loss(service_client, sft_data):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=2).result()
    _train(tc, sft_data, 2)
    path = tc.save_state('resume-me').result().path
    assert path.startswith('tinker://') and path.endswith('/weights/resume-me')
    reference = _train(tc, sft_data, 2)  # the next two losses of the original run

    resumed = service_client.create_training_client_from_state_with_optimizer(path).result()
    assert _train(resumed, sft_data, 2) == pytest.approx(reference, rel=1e-5)

    # without the optimizer state the first loss is the same but the Adam moments are fresh
    fresh = service_client.create_training_client_from_state(path).result()
    again = _train(fresh, sft_data, 2)
    assert again[0] == pytest.approx(reference[0], rel=1e-5)
    assert again[1] != pytest.approx(reference[1], rel=1e-4)


def test_load_state_into_existing_client(service_client, sft_data):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    start = _loss(tc, sft_data)
    path = tc.save_state('start').result().path
    _train(tc, sft_data, 2)
    assert _loss(tc, sft_data) < start
    tc.load_state_with_optimizer(path).result()  # the deprecated {model_id, seq_id} form
    assert _loss(tc, sft_data) == pytest.approx(start, rel=1e-5)


def test_forward_backward_custom_matches_cross_entropy(service_client, sft_data):
    """A custom loss equal to weighted cross-entropy takes the same optimizer step as the built-in one."""
    import torch

    def custom(data, logprobs_list):
        loss = sum(-(lp * d.loss_fn_inputs['weights'].to_torch()).sum() for d, lp in zip(data, logprobs_list))
        return loss, {'custom:sum': float(loss.detach())}

    a = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=4).result()
    b = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=4).result()
    out = a.forward_backward_custom(sft_data, custom).result()
    assert 'custom:sum' in out.metrics
    a.optim_step(ADAM).result()
    _train(b, sft_data, 1)
    assert _loss(a, sft_data) == pytest.approx(_loss(b, sft_data), rel=1e-4)
    assert torch.is_tensor(out.loss_fn_outputs[0]['logprobs'].to_torch())


def test_rl_step_sample_then_importance_sampling(service_client, sft_data, tokenizer):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=5).result()
    _train(tc, sft_data, 1)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(tokenizer.encode('User: Who are you?\nAssistant:'))
    res = sampler.sample(prompt, num_samples=4, sampling_params=types.SamplingParams(max_tokens=6, seed=7)).result()
    assert len(res.sequences) == 4
    assert all(s.logprobs is not None and len(s.logprobs) == len(s.tokens) > 0 for s in res.sequences)
    assert all(s.sequence_id for s in res.sequences)

    rewards = np.array([len(set(s.tokens)) for s in res.sequences], dtype=np.float32)
    advantages = rewards - rewards.mean()
    data = []
    for seq, adv in zip(res.sequences, advantages):
        tokens = prompt.to_ints() + seq.tokens
        n_prompt = prompt.length
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    'target_tokens': tokens[1:],
                    'logprobs': [0.0] * (n_prompt - 1) + list(seq.logprobs),
                    'advantages': [0.0] * (n_prompt - 1) + [float(adv)] * len(seq.tokens),
                },
            )
        )
    out = tc.forward_backward(data, 'importance_sampling').result()
    assert math.isfinite(out.metrics['loss:sum'])
    # the learner's log-probs of the sampled tokens equal the sampler's (same weights): ratio 1
    for seq, o in zip(res.sequences, out.loss_fn_outputs):
        learner = o['logprobs'].to_numpy()[-len(seq.tokens) :]
        np.testing.assert_allclose(learner, seq.logprobs, atol=1e-3)
    tc.optim_step(ADAM).result()


@pytest.mark.parametrize(
    'loss_fn,config',
    [('ppo', {'clip_low_threshold': 0.9, 'clip_high_threshold': 1.1}), ('cispo', None), ('dro', {'beta': 0.1})],
)
def test_rl_losses_run(service_client, sft_data, loss_fn, config):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=6).result()
    data = [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                'target_tokens': d.loss_fn_inputs['target_tokens'],
                'logprobs': [-1.0] * d.model_input.length,
                'advantages': [1.0] * d.model_input.length,
            },
        )
        for d in sft_data
    ]
    out = tc.forward_backward(data, loss_fn, loss_fn_config=config).result()
    assert math.isfinite(out.metrics['loss:sum']) and out.metrics['loss:sum'] != 0.0


def test_compute_logprobs_has_nan_free_tail_and_none_first(service_client, sft_data, tokenizer):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=8).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    ids = tokenizer.encode('User: Say hello.\nAssistant: Hello there')
    lps = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    assert lps[0] is None and len(lps) == len(ids)
    fwd = tc.forward(
        [types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={'target_tokens': ids[1:]})],
        'cross_entropy',
    ).result()
    np.testing.assert_allclose(lps[1:], fwd.loss_fn_outputs[0]['logprobs'].to_numpy(), atol=1e-4)


def test_list_and_delete_checkpoints(server, service_client, alice, sft_data):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=9).result()
    state = tc.save_state('ck-a').result().path
    sampler_path = tc.save_weights_for_sampler('ck-b').result().path
    rest = tinker.RestClient(base_url=server.base_url, api_key=alice)
    listed = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert {c.tinker_path for c in listed} >= {state, sampler_path}
    assert {c.checkpoint_type for c in listed} >= {'training', 'sampler'}
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert info.base_model == MODEL and info.lora_rank == 4

    run = rest.get_training_run(tc.model_id).result()
    assert run.training_run_id == tc.model_id and run.lora_rank == 4 and run.last_checkpoint is not None
    page = rest.list_training_runs(limit=1).result()
    assert len(page.training_runs) == 1 and page.cursor.total_count >= 1

    sampling = service_client.create_sampling_client(model_path=sampler_path).result()
    assert (
        sampling.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result().sequences
    )

    rest.delete_checkpoint(tc.model_id, 'weights/ck-a').result()
    remaining = {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    assert state not in remaining and sampler_path in remaining
    assert not list(server.data_dir.rglob('ck-a'))
