"""The SDK 0.38 sampling extras through vLLM: the unmodified tinker SDK asks a real server (uvicorn on 127.0.0.1,
its engine the session's shared vLLM sampler) for top-k log-probs of the sampled tokens and of the prompt positions
(the cookbook's SDFT teacher call, with `prompt_logprobs_last_n`); they equal a plain `transformers` forward's
log-softmax (fp32, 1e-4). What vLLM cannot compute (log-probs of arbitrary ids at prompt positions, draws there)
fails with a 422 naming it, and a k above the engine's ``max_logprobs`` (its declared `max_top_logprobs`) with one
naming that."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip('vllm')
tinker = pytest.importorskip('tinker')
import torch  # noqa: E402
from tinker import types  # noqa: E402

MODEL = 'tiny-qwen3-vllm-extras'
ATOL = 1e-4


@pytest.fixture(scope='module')
def vllm_client(tmp_path_factory, tiny_model_dir, vllm_sampler):
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.engine.model_host.local import LocalModelHost
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    logging.getLogger('tinker').setLevel(logging.ERROR)
    engine = LocalModelHost(MODEL, str(tiny_model_dir), device='cpu', sampler=vllm_sampler)
    config = ServerConfig(
        models={MODEL: str(tiny_model_dir)}, data_dir=str(tmp_path_factory.mktemp('vllm-extras')), port=free_port()
    )
    running = start_in_thread(config, hosts={MODEL: engine})
    client = tinker.ServiceClient(base_url=running.base_url, api_key=create_api_key(running.service.store, 'erin'))
    yield client.create_sampling_client(base_model=MODEL).result()
    running.stop()


def test_vllm_top_k_of_samples_and_prompt_equal_the_forward(vllm_client, tiny_model_dir, vllm_sampler):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    prompt = tokenizer.encode('User: Say hello.\nAssistant: Hello')
    k = 5

    out = vllm_client.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=4, temperature=1.0, seed=2),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        topk_sample_logprobs=k,
        prompt_logprobs_last_n=4,
    ).result()
    seq = out.sequences[0]
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([prompt + seq.tokens])).logits[0].float().log_softmax(-1)

    def check(top, row):
        tokens, lps = [t for t, _ in top], [lp for _, lp in top]
        assert len(set(tokens)) == k and lps == sorted(lps, reverse=True)
        np.testing.assert_allclose(lps, row[tokens].numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(lps, row.topk(k).values.numpy(), atol=ATOL, rtol=0)

    cut = len(prompt) - 4
    assert out.topk_prompt_logprobs[:cut] == [None] * cut and out.prompt_logprobs[:cut] == [None] * cut
    for p in range(cut, len(prompt)):
        check(out.topk_prompt_logprobs[p], ref[p - 1])
        assert out.prompt_logprobs[p] == pytest.approx(float(ref[p - 1, prompt[p]]), abs=ATOL)
    assert len(seq.topk_logprobs) == len(seq.tokens)
    for j, top in enumerate(seq.topk_logprobs):
        check(top, ref[len(prompt) + j - 1])

    ids = torch.full((len(prompt) - 1, 1), -1, dtype=torch.int64)
    ids[-1, 0] = 7
    with pytest.raises(tinker.RequestFailedError, match='does not support prompt_target_tokens'):
        vllm_client.sample(
            types.ModelInput.from_ints(prompt),
            1,
            types.SamplingParams(max_tokens=1),
            target_prompt_logprobs=types.TensorData.from_torch(ids),
        ).result()
    limit = vllm_sampler.capabilities.max_top_logprobs
    with pytest.raises(
        tinker.RequestFailedError, match=f'prompt_top_logprobs={limit + 1} .* above the {limit} most likely'
    ):
        vllm_client.sample(
            types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=1), topk_prompt_logprobs=limit + 1
        ).result()
