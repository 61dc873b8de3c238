"""The service with vLLM sampling: the unmodified tinker SDK trains a LoRA on the server, saves it for sampling,
and samples it -- the sampled tokens' logprobs equal the training forward's (1e-4); base-model sampling works
too. The server is real (uvicorn on 127.0.0.1); its engine uses the session's vLLM sampler."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip('vllm')
tinker = pytest.importorskip('tinker')
from tinker import types  # noqa: E402

MODEL = 'tiny-qwen3-vllm'


@pytest.fixture(scope='module')
def vllm_server(tmp_path_factory, tiny_model_dir, vllm_sampler):
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.engine.model_host.local import LocalModelHost
    from twinkle_server.launch import free_port

    logging.getLogger('tinker').setLevel(logging.ERROR)
    engine = LocalModelHost(MODEL, str(tiny_model_dir), device='cpu', sampler=vllm_sampler)
    config = ServerConfig(
        models={MODEL: str(tiny_model_dir)}, data_dir=str(tmp_path_factory.mktemp('vllm-data')), port=free_port()
    )
    running = start_in_thread(config, hosts={MODEL: engine})
    yield running
    running.stop()
    for name in vllm_sampler.list_adapters():  # leave the shared engine as we found it
        vllm_sampler.remove_adapter(name)


def test_tinker_sdk_samples_a_trained_adapter_through_vllm(vllm_server, tiny_model_dir):
    from transformers import AutoTokenizer

    from twinkle_server.service.auth import create_api_key

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    client = tinker.ServiceClient(
        base_url=vllm_server.base_url, api_key=create_api_key(vllm_server.service.store, 'carol')
    )
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    prompt, answer = tokenizer.encode('User: Say hello.\nAssistant:'), tokenizer.encode(' Hello there, friend.')
    tokens = prompt + answer
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={'target_tokens': tokens[1:], 'weights': [0.0] * (len(prompt) - 1) + [1.0] * len(answer)},
    )
    for _ in range(3):
        tc.forward_backward([datum], 'cross_entropy').result()
        tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()

    sampler = tc.save_weights_and_get_sampling_client().result()
    out = sampler.sample(
        types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    ).result()
    assert len(out.sequences) == 2
    for seq in out.sequences:
        full = prompt + list(seq.tokens)
        fwd = tc.forward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={'target_tokens': full[1:]}
                )
            ],
            'cross_entropy',
        ).result()
        reference = fwd.loss_fn_outputs[0]['logprobs'].to_numpy()[len(prompt) - 1 :]
        np.testing.assert_allclose(seq.logprobs, reference, atol=1e-4)

    base = client.create_sampling_client(base_model=MODEL).result()
    greedy = base.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=4, temperature=0.0)
    ).result()
    assert len(greedy.sequences[0].tokens) == 4
