"""The server's training backend is chosen by registry name (`twinkle server start --backend NAME`): here
`TransformersModel` or `MegatronModel` (when twinkle-megatron is installed) instead of the default multi-LoRA
backend. The unmodified tinker SDK trains on it (the loss falls; the engine calls it once per adapter, as neither
declares mixed adapters). `TransformersModel` trains one adapter: a second training model is refused with a 403
that names the backend and its limit; `MegatronModel` trains a second adapter beside the first, which stays as it
was."""

from __future__ import annotations

import logging

import numpy as np
import pytest

tinker = pytest.importorskip('tinker')
from server_names import backend_server  # noqa: E402
from tinker import types  # noqa: E402

MODEL = 'tiny-single'


@pytest.fixture(scope='module', params=['TransformersModel', 'MegatronModel'])
def single_adapter_server(request, tmp_path_factory, tiny_model_dir):
    backend = request.param
    if backend == 'MegatronModel':
        pytest.importorskip('twinkle_megatron')
    logging.getLogger('tinker').setLevel(logging.ERROR)
    data_dir = tmp_path_factory.mktemp('single-backend')
    with backend_server(tiny_model_dir, data_dir, backend, 'dora', MODEL) as (url, key):
        yield url, key, backend


def test_the_backend_trains_through_the_sdk_and_hosts_the_adapters_it_declares(
    single_adapter_server, tiny_model_dir, sft_data
):
    url, key, backend = single_adapter_server
    client = tinker.ServiceClient(base_url=url, api_key=key)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=11).result()
    answer_logprob = []
    for _ in range(4):
        out = tc.forward_backward(sft_data, 'cross_entropy').result()
        answer_logprob.append(
            sum(
                float(np.dot(o['logprobs'].to_numpy(), d.loss_fn_inputs['weights'].to_numpy()))
                for o, d in zip(out.loss_fn_outputs, sft_data)
            )
        )
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    # the answers' summed logprob rises: the loss falls (at lr 1e-2 Adam moves every LoRA weight by ~lr per step,
    # so the curve is not monotonic; the backends initialise adapters differently and take different paths)
    assert max(answer_logprob[1:]) > answer_logprob[0] + 1.0

    sampler = tc.save_weights_and_get_sampling_client('trained').result()  # the adapter the backend exported
    prompt = types.ModelInput.from_ints(sft_data[0].model_input.to_ints()[:8])
    sampled = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=0.0)).result()
    assert len(sampled.sequences[0].tokens) == 4

    if backend == 'TransformersModel':
        with pytest.raises(tinker.PermissionDeniedError, match=f'{backend}, which trains at most 1 adapter'):
            client.create_lora_training_client(base_model=MODEL, rank=4).result()
        return
    # MegatronModel trains several adapters on one base: a second client's adapter trains beside the first
    # without moving it (the first's forward is the same before and after the second's steps)
    second = client.create_lora_training_client(base_model=MODEL, rank=8, seed=3).result()
    first_before = tc.forward(sft_data, 'cross_entropy').result().loss_fn_outputs
    for _ in range(2):
        second.forward_backward(sft_data, 'cross_entropy').result()
        second.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    first_after = tc.forward(sft_data, 'cross_entropy').result().loss_fn_outputs
    for before, after in zip(first_before, first_after):
        np.testing.assert_allclose(after['logprobs'].to_numpy(), before['logprobs'].to_numpy(), atol=1e-6)
    second_out = second.forward(sft_data, 'cross_entropy').result().loss_fn_outputs
    assert any(
        not np.allclose(s['logprobs'].to_numpy(), f['logprobs'].to_numpy(), atol=1e-3)
        for s, f in zip(second_out, first_after)
    )
