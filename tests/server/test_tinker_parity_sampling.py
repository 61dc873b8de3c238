"""Sampling extras of SDK 0.38 through the unmodified `tinker` SDK against a real server (TorchSampler, tiny Qwen3 in
fp32 on CPU): top-k log-probs of the sampled tokens and of the prompt positions, `prompt_logprobs_last_n`,
`target_prompt_logprobs` (dense and sparse CSR), `prompt_alt_tokens_k`, the cookbook's SDFT top-k teacher call,
and the 4xx answers: widths above the server's caps, and a sampler that does not declare a capability.

Every log-prob is checked against the log-softmax of a plain `transformers` forward of the same weights in fp32,
within ATOL = 1e-4 (the sampler runs its own batched forward; the values agree to ~1e-6 in practice). Top-k lists
are checked tie-robustly: k distinct tokens, sorted by log-prob (descending), each value the reference's log-prob of
its own token, and the values the reference's k largest."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np
import pytest
import tinker
import torch
from server_names import MODEL
from tinker import types

ATOL = 1e-4
PROMPT_TEXT = 'User: What is 2+3?\nAssistant: The answer is'


@pytest.fixture(scope='module')
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope='module')
def base(service_client):
    return service_client.create_sampling_client(base_model=MODEL).result()


@pytest.fixture(scope='module')
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode(PROMPT_TEXT)


def reference(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] log-softmax; row i is the distribution over token i + 1."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)


def assert_topk(entries, row: torch.Tensor, k: int) -> None:
    """`entries`: the SDK's [(token, logprob), ...] at one position; `row`: the reference log-softmax there."""
    assert entries is not None and len(entries) == k
    tokens, lps = [t for t, _ in entries], [lp for _, lp in entries]
    assert len(set(tokens)) == k
    assert lps == sorted(lps, reverse=True)
    np.testing.assert_allclose(lps, row[tokens].numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(lps, row.topk(k).values.numpy(), atol=ATOL, rtol=0)


def test_topk_sample_logprobs_are_the_models_top_k_at_each_generated_token(base, prompt, hf_model):
    k = 5
    out = base.sample(
        types.ModelInput.from_ints(prompt),
        2,
        types.SamplingParams(max_tokens=6, temperature=1.0, seed=11),
        topk_sample_logprobs=k,
    ).result()
    assert len(out.sequences) == 2
    assert out.topk_prompt_logprobs is None and out.prompt_logprobs is None
    in_list = 0
    for seq in out.sequences:
        ref = reference(hf_model, prompt + seq.tokens)
        assert len(seq.topk_logprobs) == len(seq.tokens) == len(seq.logprobs)
        assert seq.topk_logprobs_np.token_ids.shape == (len(seq.tokens), k)
        for j, (token, logprob, top) in enumerate(zip(seq.tokens, seq.logprobs, seq.topk_logprobs)):
            row = ref[len(prompt) + j - 1]
            assert_topk(top, row, k)
            assert logprob == pytest.approx(float(row[token]), abs=ATOL)
            if token in dict(top):  # the sampled token's logprob is the one its top-k entry carries
                assert dict(top)[token] == pytest.approx(logprob, abs=1e-6)
                in_list += 1
            else:  # not in the list: less likely than every entry
                assert logprob <= top[-1][1] + ATOL
    assert in_list > 0


def test_topk_prompt_logprobs_and_prompt_logprobs_equal_the_forward(base, prompt, hf_model):
    k = 4
    out = base.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
    ).result()
    ref = reference(hf_model, prompt)
    assert len(out.prompt_logprobs) == len(out.topk_prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None and out.topk_prompt_logprobs[0] is None
    assert out.topk_prompt_logprobs_np.token_ids.shape == (len(prompt), k)
    for p in range(1, len(prompt)):
        assert_topk(out.topk_prompt_logprobs[p], ref[p - 1], k)
        assert out.prompt_logprobs[p] == pytest.approx(float(ref[p - 1, prompt[p]]), abs=ATOL)
        top = dict(out.topk_prompt_logprobs[p])
        if prompt[p] in top:
            assert top[prompt[p]] == pytest.approx(out.prompt_logprobs[p], abs=1e-6)
    assert out.sequences[0].topk_logprobs is None  # not asked for the sampled token


def test_prompt_logprobs_last_n_scores_only_the_suffix(base, prompt, hf_model):
    n, k = 3, 2
    ref = reference(hf_model, prompt)
    out = base.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        prompt_logprobs_last_n=n,
    ).result()  # the SDK itself checks nothing before the suffix was scored
    cut = len(prompt) - n
    assert out.prompt_logprobs[:cut] == [None] * cut
    assert out.topk_prompt_logprobs[:cut] == [None] * cut
    for p in range(cut, len(prompt)):
        assert out.prompt_logprobs[p] == pytest.approx(float(ref[p - 1, prompt[p]]), abs=ATOL)
        assert_topk(out.topk_prompt_logprobs[p], ref[p - 1], k)

    lps = base.compute_logprobs(types.ModelInput.from_ints(prompt), prompt_logprobs_last_n=n).result()
    assert lps[:cut] == [None] * cut and len(lps) == len(prompt)
    whole = base.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    np.testing.assert_allclose(lps[cut:], whole[cut:], atol=ATOL)
    # n = len(prompt) - 1 is the whole prompt; beyond it is refused
    assert base.compute_logprobs(types.ModelInput.from_ints(prompt), len(prompt) - 1).result()[1] is not None
    with pytest.raises(tinker.UnprocessableEntityError, match='prompt_logprobs_last_n=.* more than'):
        base.compute_logprobs(types.ModelInput.from_ints(prompt), len(prompt)).result()


@pytest.mark.parametrize('sparse', [False, True], ids=['dense', 'sparse'])
def test_target_prompt_logprobs_score_the_named_ids(base, prompt, hf_model, sparse):
    """The cookbook's `decisions` call: a -1-padded [len(prompt) - 1, K] id matrix (sent sparse there), max_tokens=1,
    no prompt logprobs; the answer has the request's shape and layout, 0.0 in -1 cells."""
    ref = reference(hf_model, prompt)
    ids = torch.full((len(prompt) - 1, 3), -1, dtype=torch.int64)
    ids[len(prompt) - 2] = torch.tensor([10, 20, 30])  # row i scores prompt position i + 1: the last token
    ids[2, 1] = prompt[3]
    target = types.TensorData.from_torch_sparse(ids, pad_value=-1) if sparse else types.TensorData.from_torch(ids)
    assert (target.sparse_crow_indices is not None) == sparse
    out = base.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=1), target_prompt_logprobs=target
    ).result()
    got = out.target_prompt_logprobs
    assert got.dtype == 'float32' and list(got.shape) == list(ids.shape)
    assert (got.sparse_crow_indices is not None) == sparse
    dense = got.to_torch()
    for i, j in zip(*np.nonzero(ids.numpy() >= 0)):
        assert float(dense[i, j]) == pytest.approx(float(ref[i, ids[i, j]]), abs=ATOL)
    assert bool((dense[ids < 0] == 0.0).all())
    assert out.prompt_logprobs is None


def test_prompt_alt_tokens_are_seeded_draws_with_their_logprobs(base, prompt, hf_model):
    k = 3
    ref = reference(hf_model, prompt)

    def draw(temperature: float, seed: int):
        out = base.sample(
            types.ModelInput.from_ints(prompt),
            1,
            types.SamplingParams(max_tokens=1, temperature=temperature, seed=seed),
            prompt_alt_tokens_k=k,
        ).result()
        alt = out.prompt_alt_tokens
        assert list(alt.tokens.shape) == list(alt.logprobs.shape) == [len(prompt) - 1, k]
        assert alt.tokens.dtype == 'int64' and alt.logprobs.dtype == 'float32'
        return alt.tokens.to_torch(), alt.logprobs.to_torch()

    tokens, logprobs = draw(1.0, 5)
    torch.testing.assert_close(logprobs, ref[:-1].gather(-1, tokens), atol=ATOL, rtol=0)  # raw (T=1) logprobs
    again, _ = draw(1.0, 5)
    assert torch.equal(tokens, again)  # a seed reproduces the draws
    greedy, _ = draw(0.0, 5)
    assert torch.equal(greedy, ref[:-1].argmax(-1, keepdim=True).expand(-1, k))  # temperature 0: the argmax


def test_sdft_topk_teacher_targets_come_from_the_servers_top_k(base, tokenizer, hf_model):
    """`tinker_cookbook.distillation.sdft.build_topk_distillation_datums` as `recipes.sdft` calls it (K=20, the
    recipe's default): teacher-forced completions scored with `include_prompt_logprobs` + `topk_prompt_logprobs`,
    turned into (N, K) soft targets (the teacher's top-K renormalised) at the completion positions."""
    from tinker_cookbook.distillation.sdft import build_topk_distillation_datums

    k = 20
    student = tokenizer.encode('User: What is 2+3?\nAssistant:')
    completion = tokenizer.encode(' The answer is 5.')
    teacher = tokenizer.encode('User: What is 2+3? An example answer: 5.\nAssistant:')
    tokens = student + completion
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            'target_tokens': tokens[1:],
            'mask': types.TensorData.from_numpy(
                np.array([0.0] * (len(student) - 1) + [1.0] * len(completion), dtype=np.float32)
            ),
        },
    )
    datums, metrics = asyncio.run(
        build_topk_distillation_datums(
            [datum], [{'group_idx': 0}], base, [types.ModelInput.from_ints(teacher)], topk=k, skip_first_n_tokens=0
        )
    )
    assert metrics['sdft/topk'] == k and metrics['sdft/total_completion_tokens'] == len(completion)
    targets = datums[0].loss_fn_inputs['target_tokens'].to_torch()
    weights = datums[0].loss_fn_inputs['weights'].to_torch()
    assert targets.shape == weights.shape == (len(tokens) - 1, k)
    ref = reference(hf_model, teacher + completion)
    for t in range(len(completion)):
        student_pos, teacher_pos = len(student) - 1 + t, len(teacher) + t
        top = ref[teacher_pos - 1].topk(k)
        np.testing.assert_allclose(
            weights[student_pos].numpy(), top.values.softmax(-1).numpy(), atol=ATOL, rtol=0
        )  # the teacher's top-K, renormalised
        assert weights[student_pos].sum() == pytest.approx(1.0, abs=1e-5)
        assert set(targets[student_pos].tolist()) == set(top.indices.tolist()) or bool(
            torch.isclose(top.values[-1], ref[teacher_pos - 1].topk(k + 1).values[-1], atol=ATOL)
        )  # the same tokens, up to a tie at the K-th place
    assert float(weights[: len(student) - 1].abs().sum()) == 0.0  # nothing on the prompt


@pytest.mark.parametrize(
    'asked, match',
    [
        ({'topk_sample_logprobs': 65}, r'top-k width of sampled-token logprobs \(65\) exceeds .* max_topk_logprobs=64'),
        ({'topk_prompt_logprobs': 1000}, r'max_topk_logprobs=64'),
        ({'prompt_alt_tokens_k': 100}, r'alt-token draws per position \(100\) exceeds .* max_topk_logprobs=64'),
    ],
    ids=['sample k', 'prompt k', 'alt k'],
)
def test_a_k_above_the_servers_cap_is_a_400_naming_it(base, prompt, asked, match):
    with pytest.raises(tinker.BadRequestError, match=match):
        base.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=1), **asked).result()


def test_bad_targets_are_refused_with_what_to_fix(base, prompt):
    def send(ids: torch.Tensor):
        return base.sample(
            types.ModelInput.from_ints(prompt),
            1,
            types.SamplingParams(max_tokens=1),
            target_prompt_logprobs=types.TensorData.from_torch(ids),
        ).result()

    with pytest.raises(tinker.UnprocessableEntityError, match=r'has 2 rows .* needs len\(prompt\) - 1'):
        send(torch.zeros((2, 1), dtype=torch.int64))
    with pytest.raises(tinker.UnprocessableEntityError, match='names no token id'):
        send(torch.full((len(prompt) - 1, 2), -1, dtype=torch.int64))
    with pytest.raises(tinker.BadRequestError, match='ids below -1'):
        send(torch.full((len(prompt) - 1, 1), -7, dtype=torch.int64))


@pytest.fixture(scope='module')
def limited_server(tmp_path_factory, tiny_model_dir):
    """A server whose sampler declares no prompt top-k, target ids or draws, and at most 4 alternatives per position:
    what it lacks must come back as a 4xx naming it, never a silent answer without the fields."""
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.engine.model_host.local import LocalModelHost
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key
    from twinkle_transformers.sampler import TorchSampler

    class LimitedSampler(TorchSampler):
        capabilities = dataclasses.replace(
            TorchSampler.capabilities,
            max_top_logprobs=4,
            prompt_top_logprobs=False,
            prompt_target_logprobs=False,
            prompt_alt_tokens=False,
        )

    logging.getLogger('tinker').setLevel(logging.ERROR)
    name = 'tiny-limited'
    host = LocalModelHost(
        name, str(tiny_model_dir), device='cpu', sampler=LimitedSampler(str(tiny_model_dir), device='cpu')
    )
    config = ServerConfig(
        models={name: str(tiny_model_dir)}, data_dir=str(tmp_path_factory.mktemp('limited')), port=free_port()
    )
    running = start_in_thread(config, hosts={name: host})
    client = tinker.ServiceClient(base_url=running.base_url, api_key=create_api_key(running.service.store, 'dora'))
    yield client.create_sampling_client(base_model=name).result()
    running.stop()


@pytest.mark.parametrize(
    'asked, match',
    [
        ({'topk_sample_logprobs': 5}, r'top_logprobs=5 .* above the 4 most likely tokens per position'),
        ({'topk_prompt_logprobs': 2}, r'does not support prompt_top_logprobs \(top-k log-probs at prompt positions\)'),
        ({'prompt_alt_tokens_k': 2}, r'does not support prompt_alt_tokens'),
        (
            {'target_prompt_logprobs': types.TensorData.from_torch(torch.tensor([[3], [-1]]))},
            r'does not support prompt_target_tokens \(log-probs of chosen token ids',
        ),
    ],
    ids=['sample k', 'prompt top-k', 'alt tokens', 'target ids'],
)
def test_a_sampler_without_the_capability_answers_422(limited_server, asked, match):
    with pytest.raises(tinker.RequestFailedError, match=match):
        limited_server.sample(
            types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=1), **asked
        ).result()
    ok = limited_server.sample(
        types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=2), topk_sample_logprobs=4
    ).result()
    assert [len(step) for step in ok.sequences[0].topk_logprobs] == [4, 4]
