"""Training-side parity with tinker SDK 0.38, through the unmodified SDK against a real server: the `gspo` and
`stable_reinforce` losses (values checked against the formulas of docs/tinker_api.md, computed here from the
log-probs the server returns; with and without provenance; `loss_fn_config` honoured, bad config a 4xx) and the
`dimuon` optimizer (learns, differs from Adam, resumes exactly, per tenant).

Tolerance of the loss checks: the server computes in float32 and returns float32 log-probs; the expectations are
float64 sums over ~20-40 tokens of those log-probs: they agree to rel 1e-4 (float32 rounding of the sum).
Resuming Dimuon state is checked to rel 1e-6 (on CPU the resumed losses are bit-identical)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tinker
from server_names import MODEL
from test_cookbook import ALIAS, _recipe, cookbook_env  # noqa: F401 - cookbook_env is a fixture
from tinker import types
from tinker.types.optimizer import OptimizerConfigBase

REL = 1e-4
ADAM = types.AdamParams(learning_rate=5e-3)
DIMUON = types.DimuonParams(learning_rate=0.02)


# ---- helpers --------------------------------------------------------------------------------------------------
def _rl_data(sft_data, seed: int, *, ratio_mask: bool = False, thresholds: bool = False) -> list[types.Datum]:
    """The SFT examples as RL datums: behaviour log-probs q far from the learner's (|log r| up to ~0.5), one
    advantage per datum on its answer tokens (0 on the prompt), optionally gspo's per-token inputs."""
    rng = np.random.default_rng(seed)
    out = []
    for i, d in enumerate(sft_data):
        answer = d.loss_fn_inputs['weights'].to_numpy() > 0
        n = d.model_input.length
        q = np.where(answer, -2.0 + rng.normal(0.0, 0.5, n), 0.0).astype(np.float32)
        adv = np.where(answer, [1.0, -0.5, 2.0, -1.5][i % 4], 0.0).astype(np.float32)
        inputs = {'target_tokens': d.loss_fn_inputs['target_tokens'], 'logprobs': q, 'advantages': adv}
        if ratio_mask:  # only the first half of the answer enters the sequence ratio
            idx = np.flatnonzero(answer)
            mask = np.zeros(n, dtype=np.float32)
            mask[idx[: max(1, len(idx) // 2)]] = 1.0
            inputs['sequence_ratio_mask'] = mask
        if thresholds:
            inputs['clip_low_threshold'] = np.full(n, 0.5 + 0.1 * i, dtype=np.float32)
            inputs['clip_high_threshold'] = np.full(n, 1.1, dtype=np.float32)
        out.append(types.Datum(model_input=d.model_input, loss_fn_inputs=inputs))
    return out


def _arr(d: types.Datum, name: str) -> np.ndarray:
    return d.loss_fn_inputs[name].to_numpy().astype(np.float64)


def _logprobs(out: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [o['logprobs'].to_numpy().astype(np.float64) for o in out.loss_fn_outputs]


def gspo_expected(data, lps, lo: float, hi: float) -> float:
    """docs/tinker_api.md: s = exp(mean_{t in M}(lp - q)), M = sequence_ratio_mask != 0 (default A != 0);
    loss = -sum_t min(s A_t, clip(s, lo_t, hi_t) A_t), per-token thresholds where the datum gives them."""
    total = 0.0
    for d, lp in zip(data, lps):
        q, a = _arr(d, 'logprobs'), _arr(d, 'advantages')
        m = _arr(d, 'sequence_ratio_mask') != 0 if 'sequence_ratio_mask' in d.loss_fn_inputs else a != 0
        s = math.exp(float(np.mean(lp[m] - q[m]))) if m.any() else 1.0
        low = _arr(d, 'clip_low_threshold') if 'clip_low_threshold' in d.loss_fn_inputs else np.full(len(a), lo)
        high = _arr(d, 'clip_high_threshold') if 'clip_high_threshold' in d.loss_fn_inputs else np.full(len(a), hi)
        total -= float(np.sum(np.minimum(s * a, np.clip(s, low, high) * a)))
    return total


def stable_reinforce_expected(lps, qs, advs, actions, lo: float, hi: float, kl: float) -> float:
    """docs/tinker_api.md: sum over action tokens of -clip(r, lo, hi) lp A + kl (r - 1 - log r), r = exp(lp - q)."""
    total = 0.0
    for lp, q, a, m in zip(lps, qs, advs, actions):
        log_r = lp[m] - q[m]
        r = np.exp(log_r)
        total += float(np.sum(-np.clip(r, lo, hi) * lp[m] * a[m] + kl * (r - 1.0 - log_r)))
    return total


def _refused(call, status: int | None = None) -> tinker.APIStatusError:
    """`call()` must fail fast with a 4xx (an answer, not a retry loop)."""
    with pytest.raises(tinker.APIStatusError) as refused:
        call().result(timeout=60)
    assert 400 <= refused.value.status_code < 500, refused.value
    if status is not None:
        assert refused.value.status_code == status, refused.value
    return refused.value


def _ce_step(tc, data, params) -> float:
    fwd = tc.forward_backward(data, 'cross_entropy')
    opt = tc.optim_step(params)
    loss = fwd.result().metrics['loss:sum']
    opt.result()
    return loss


def _ce(tc, data) -> float:
    return tc.forward(data, 'cross_entropy').result().metrics['loss:sum']


# ---- gspo ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'config, options',
    [
        (None, {}),  # GSPO paper thresholds 1 - 3e-4 / 1 + 4e-4: nearly every sequence clipped
        ({'clip_low_threshold': 0.7, 'clip_high_threshold': 1.3}, {}),
        ({'clip_low_threshold': 0.9, 'clip_high_threshold': 1.2}, {'ratio_mask': True}),
        (None, {'thresholds': True}),  # per-token thresholds in loss_fn_inputs take precedence
    ],
)
def test_gspo_equals_the_formula(service_client, sft_data, config, options):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=31).result()
    _ce_step(tc, sft_data, ADAM)  # LoRA B off zero: the learner is not the base model
    data = _rl_data(sft_data, seed=1, **options)
    lo, hi = (config or {}).get('clip_low_threshold', 1 - 3e-4), (config or {}).get('clip_high_threshold', 1 + 4e-4)
    fwd = tc.forward(data, 'gspo', loss_fn_config=config).result()
    want = gspo_expected(data, _logprobs(fwd), lo, hi)
    assert fwd.metrics['loss:sum'] == pytest.approx(want, rel=REL), (fwd.metrics, want)
    out = tc.forward_backward(data, 'gspo', loss_fn_config=config).result()
    assert out.metrics['loss:sum'] == pytest.approx(want, rel=REL)
    tc.optim_step(ADAM).result()
    assert tc.forward(data, 'gspo', loss_fn_config=config).result().metrics['loss:sum'] != pytest.approx(want, rel=REL)


# ---- stable_reinforce without provenance (cookbook 0.5.8 sends none) -----------------------------------------
@pytest.mark.parametrize(
    'config', [None, {'kl_coeff': 0.25, 'clip_low_threshold': 0.5, 'clip_high_threshold': 1.2}, {'kl_coeff': 1.0}]
)
def test_stable_reinforce_without_provenance_equals_the_formula(service_client, sft_data, config):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=32).result()
    _ce_step(tc, sft_data, ADAM)
    data = _rl_data(sft_data, seed=2)
    cfg = config or {}
    lo, hi, kl = cfg.get('clip_low_threshold', 0.0), cfg.get('clip_high_threshold', 2.0), cfg.get('kl_coeff', 0.0)
    out = tc.forward_backward(data, 'stable_reinforce', loss_fn_config=config).result()
    lps = _logprobs(out)
    advs = [_arr(d, 'advantages') for d in data]
    want = stable_reinforce_expected(lps, [_arr(d, 'logprobs') for d in data], advs, [a != 0 for a in advs], lo, hi, kl)
    assert out.metrics['loss:sum'] == pytest.approx(want, rel=REL), (out.metrics, want)
    tc.optim_step(ADAM).result()


# ---- stable_reinforce with provenance --------------------------------------------------------------------------
def _sample_recorded(tc, tokenizer, n: int = 2):
    sampler = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
    prompt = tokenizer.encode('User: Who are you?\nAssistant:')
    res = sampler.sample(
        types.ModelInput.from_ints(prompt), num_samples=n, sampling_params=types.SamplingParams(max_tokens=6, seed=3)
    ).result()
    return prompt, res.sequences


def _provenance_datum(prompt, seq, *, advantage: float, logprobs=None, claim_offset: int = 0) -> types.Datum:
    """prompt + sampled tokens as one datum whose spans name the recorded sequence; the advantage is set on EVERY
    row, prompt rows included (provenance, not the advantage, decides which rows are actions)."""
    full = list(prompt) + list(seq.tokens)
    n = len(full) - 1
    inputs = {'target_tokens': full[1:], 'advantages': [advantage] * n}
    if logprobs is not None:
        inputs['logprobs'] = logprobs
    datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)
    sid = seq.sequence_id
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sid, offset=claim_offset, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=sid, offset=0, length=len(seq.tokens) - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=len(prompt) - 1),
            types.SampledProvenanceSpan(sequence_id=sid, offset=0, length=len(seq.tokens)),
        ],
    )


def test_stable_reinforce_with_provenance_uses_the_recorded_sample(service_client, sft_data, tokenizer):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=33).result()
    _ce_step(tc, sft_data, ADAM)
    prompt, seqs = _sample_recorded(tc, tokenizer)
    assert all(s.sequence_id for s in seqs)
    _ce_step(tc, sft_data, types.AdamParams(learning_rate=2e-2))  # the learner moves away from the sampler: r != 1
    advantages = [1.5, -0.75]
    # provenance only: no `logprobs` input at all, and a datum with deliberately wrong ones (ignored)
    data = [
        _provenance_datum(prompt, seqs[0], advantage=advantages[0]),
        _provenance_datum(
            prompt, seqs[1], advantage=advantages[1], logprobs=[0.0] * (len(prompt) + len(seqs[1].tokens) - 1)
        ),
    ]
    config = {'kl_coeff': 0.5, 'clip_high_threshold': 1.05}
    out = tc.forward_backward(data, 'stable_reinforce', loss_fn_config=config).result()
    lps = _logprobs(out)
    p = len(prompt) - 1  # rows [0, p) predict prompt tokens: context, not actions
    qs, advs, actions = [], [], []
    for seq, a, lp in zip(seqs, advantages, lps):
        qs.append(np.concatenate([np.zeros(p), np.asarray(seq.logprobs, dtype=np.float64)]))
        advs.append(np.full(len(lp), a))
        actions.append(np.arange(len(lp)) >= p)
    want = stable_reinforce_expected(lps, qs, advs, actions, 0.0, 1.05, 0.5)
    assert out.metrics['loss:sum'] == pytest.approx(want, rel=REL), (out.metrics, want)
    assert any(abs(lp[p:] - q[p:]).max() > 1e-3 for lp, q in zip(lps, qs))  # the check is not trivially r == 1

    # the same objective without provenance: the sampler's log-probs as `logprobs`, advantages 0 on the prompt
    plain = [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                'target_tokens': d.loss_fn_inputs['target_tokens'],
                'logprobs': q.astype(np.float32),
                'advantages': np.where(m, a, 0.0).astype(np.float32),
            },
        )
        for d, q, a, m in zip(data, qs, advs, actions)
    ]
    again = tc.forward(plain, 'stable_reinforce', loss_fn_config=config).result()
    assert again.metrics['loss:sum'] == pytest.approx(out.metrics['loss:sum'], rel=REL)
    tc.optim_step(ADAM).result()


def test_provenance_claims_are_checked(server, service_client, sft_data, tokenizer, bob):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=34).result()
    prompt, seqs = _sample_recorded(tc, tokenizer, n=1)
    seq = seqs[0]
    # a prompt span claiming the wrong offset: its tokens differ from the recorded prompt
    wrong = _provenance_datum(prompt, seq, advantage=1.0, claim_offset=1)
    err = _refused(lambda: tc.forward_backward([wrong], 'stable_reinforce'), 422)
    assert 'model_input_spans' in str(err)
    # a sequence id nobody recorded
    unknown = types.Datum(
        model_input=types.ModelInput.from_ints(list(prompt)),
        loss_fn_inputs={'target_tokens': list(prompt[1:]) + [0], 'advantages': [1.0] * len(prompt)},
    ).with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id='nope:0', length=len(prompt))],
        loss_fn_inputs=[types.SampledProvenanceSpan(sequence_id='nope:0', length=len(prompt))],
    )
    assert 'no stability information' in str(_refused(lambda: tc.forward_backward([unknown], 'stable_reinforce')))
    # another tenant cannot train on alice's recorded sequences
    other = tinker.ServiceClient(base_url=server.base_url, api_key=bob)
    bob_tc = other.create_lora_training_client(base_model=MODEL, rank=4, seed=34).result()
    good = _provenance_datum(prompt, seq, advantage=1.0)
    _refused(lambda: bob_tc.forward_backward([good], 'stable_reinforce'), 422)
    # ... while alice's own client can, and a sampler without record_stability_info records nothing
    assert math.isfinite(tc.forward_backward([good], 'stable_reinforce').result().metrics['loss:sum'])
    plain_sampler = tc.save_weights_and_get_sampling_client().result()
    res = plain_sampler.sample(
        types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=types.SamplingParams(max_tokens=4, seed=1)
    ).result()
    unrecorded = _provenance_datum(prompt, res.sequences[0], advantage=1.0)
    _refused(lambda: tc.forward_backward([unrecorded], 'stable_reinforce'), 422)


# ---- bad loss_fn_config: a 4xx at once -------------------------------------------------------------------------
@pytest.mark.parametrize(
    'loss_fn, config, match',
    [
        ('gspo', {'bogus': 1.0}, "keys \\['bogus'\\] are not valid"),
        ('gspo', {'clip_low_threshold': 1.5, 'clip_high_threshold': 1.2}, 'clip_low_threshold'),
        ('stable_reinforce', {'kl_coeff': -1.0}, 'kl_coeff'),
        ('stable_reinforce', {'kl_coeff': 'lots'}, 'kl_coeff'),
        ('stable_reinforce', {'epsilon': 0.2}, 'it takes'),
        ('ppo', {'beta': 0.1}, 'it takes'),
    ],
)
def test_bad_loss_config_is_a_4xx(service_client, sft_data, loss_fn, config, match):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=35).result()
    data = _rl_data(sft_data, seed=3)
    err = _refused(lambda: tc.forward_backward(data, loss_fn, loss_fn_config=config), 422)
    assert re.search(match, str(err)), err
    # the client goes on: the refused request freed its seq_id
    assert math.isfinite(tc.forward_backward(data, loss_fn).result().metrics['loss:sum'])


# ---- dimuon -------------------------------------------------------------------------------------------------
def _dimuon_client(service_client, seed: int):
    return service_client.create_lora_training_client(
        base_model=MODEL, rank=4, seed=seed, optimizer=types.DimuonOptimizerConfig()
    ).result()


def test_dimuon_learns_and_differs_from_adam(service_client, sft_data):
    d = _dimuon_client(service_client, 41)
    a = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=41).result()
    start = _ce(d, sft_data)
    assert _ce(a, sft_data) == pytest.approx(start, rel=1e-6)  # same seed, same start
    losses = [_ce_step(d, sft_data, DIMUON) for _ in range(6)] + [_ce(d, sft_data)]
    print('dimuon losses', [round(x, 3) for x in losses])
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(b < a_ for a_, b in zip(losses[1:], losses[2:])), losses  # steadily down once B moved
    _ce_step(a, sft_data, types.AdamParams(learning_rate=0.02))
    _ce_step(a, sft_data, types.AdamParams(learning_rate=0.02))
    assert _ce(a, sft_data) != pytest.approx(losses[2], rel=1e-3)  # another update rule, another trajectory


def test_dimuon_hyper_parameters_are_honoured_and_checked(service_client, sft_data):
    d = _dimuon_client(service_client, 42)
    _ce_step(d, sft_data, DIMUON)
    _ce_step(d, sft_data, DIMUON)
    before = _ce(d, sft_data)
    _ce_step(d, sft_data, types.DimuonParams(learning_rate=0.0))
    assert _ce(d, sft_data) == pytest.approx(before, rel=1e-6)
    _ce_step(d, sft_data, types.DimuonParams(learning_rate=0.02, beta1=0.5, grad_clip_norm=0.5))
    assert _ce(d, sft_data) < before
    _refused(lambda: d.optim_step(types.DimuonParams(learning_rate=50.0)), 400)  # DIMUON_RANGES: lr in [0, 10]
    _refused(lambda: d.optim_step(ADAM), 422)  # not this model's optimizer
    a = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=42).result()
    _refused(lambda: a.optim_step(DIMUON), 422)
    assert math.isfinite(_ce_step(d, sft_data, DIMUON)) and math.isfinite(_ce_step(a, sft_data, ADAM))


def test_unknown_optimizer_is_refused(service_client):
    with pytest.raises(tinker.APIStatusError) as refused:
        service_client.create_lora_training_client(
            base_model=MODEL, rank=4, optimizer=OptimizerConfigBase(type='lion')
        ).result(timeout=60)
    assert refused.value.status_code == 422 and 'lion' in str(refused.value)


def test_dimuon_state_resumes_exactly(service_client, sft_data):
    d = _dimuon_client(service_client, 43)
    for _ in range(2):
        _ce_step(d, sft_data, DIMUON)
    path = d.save_state('dimuon-resume').result().path
    reference = [_ce_step(d, sft_data, DIMUON) for _ in range(3)] + [_ce(d, sft_data)]

    resumed = service_client.create_training_client_from_state_with_optimizer(path).result()
    got = [_ce_step(resumed, sft_data, DIMUON) for _ in range(3)] + [_ce(resumed, sft_data)]
    print('dimuon resume', reference, got)
    assert got == pytest.approx(reference, rel=1e-6)
    _refused(lambda: resumed.optim_step(ADAM), 422)  # the checkpoint's optimizer came back with its state

    # weights only: the momenta start afresh (so the second loss differs), with the optimizer the caller picks
    fresh = service_client.create_training_client_from_state(path, optimizer=types.DimuonOptimizerConfig()).result()
    again = [_ce_step(fresh, sft_data, DIMUON) for _ in range(2)]
    assert again[0] == pytest.approx(reference[0], rel=1e-6)
    assert again[1] != pytest.approx(reference[1], rel=1e-6)
    adam_again = service_client.create_training_client_from_state(path).result()  # default: AdamW
    _refused(lambda: adam_again.optim_step(DIMUON), 422)
    assert math.isfinite(_ce_step(adam_again, sft_data, ADAM))


def test_two_tenants_with_different_optimizers_stay_isolated(server, service_client, sft_data, bob):
    other = tinker.ServiceClient(base_url=server.base_url, api_key=bob)
    # references: each optimizer alone
    solo_d = _dimuon_client(service_client, 44)
    ref_d = [_ce_step(solo_d, sft_data, DIMUON) for _ in range(3)] + [_ce(solo_d, sft_data)]
    solo_a = other.create_lora_training_client(base_model=MODEL, rank=4, seed=44).result()
    ref_a = [_ce_step(solo_a, sft_data, ADAM) for _ in range(3)] + [_ce(solo_a, sft_data)]
    # interleaved: alice trains with Dimuon, bob with AdamW, their requests queued together
    d = _dimuon_client(service_client, 44)
    a = other.create_lora_training_client(base_model=MODEL, rank=4, seed=44).result()
    got_d, got_a = [], []
    for _ in range(3):
        fd, fa = d.forward_backward(sft_data, 'cross_entropy'), a.forward_backward(sft_data, 'cross_entropy')
        od, oa = d.optim_step(DIMUON), a.optim_step(ADAM)
        got_d.append(fd.result().metrics['loss:sum'])
        got_a.append(fa.result().metrics['loss:sum'])
        od.result(), oa.result()
    got_d.append(_ce(d, sft_data))
    got_a.append(_ce(a, sft_data))
    assert got_d == pytest.approx(ref_d, rel=1e-5)
    assert got_a == pytest.approx(ref_a, rel=1e-5)
    assert ref_d[-1] != pytest.approx(ref_a[-1], rel=1e-3)
    # bob cannot load alice's optimizer state
    with pytest.raises(tinker.APIStatusError):
        other.create_training_client_from_state_with_optimizer(d.save_state('alice-only').result().path).result(
            timeout=60
        )


# ---- the cookbook's async RL recipe with stable_reinforce (slow) ------------------------------------------------
@pytest.mark.slow
def test_math_rl_async_recipe_with_stable_reinforce(tmp_path, cookbook_env):
    """`recipes/math_rl/train.py env=arithmetic` (no download) with `loss_fn=stable_reinforce` and an async config
    (`max_steps_off_policy`): cookbook 0.5.8 sends no provenance, so the datums' `logprobs` are the behaviour
    log-probs."""
    pytest.importorskip('math_verify', reason='the math_rl recipe needs tinker-cookbook[math-rl] extras')
    running, env = cookbook_env
    metrics = _recipe(
        'tinker_cookbook.recipes.math_rl.train',
        env,
        tmp_path / 'rl',
        running.base_url,
        'env=arithmetic',
        'loss_fn=stable_reinforce',
        'max_steps_off_policy=2',
        'max_steps=3',
        'group_size=4',
        'groups_per_batch=4',
        'learning_rate=1e-3',
        'max_tokens=5',
        'eval_every=0',
        'save_every=0',
    )
    for m in metrics:  # shown with `pytest -s`
        print({k: m[k] for k in ('step', 'env/all/reward/total', 'optim/entropy') if k in m})
    assert [m['step'] for m in metrics] == [0, 1, 2] and all('env/all/reward/total' in m for m in metrics)
    stats = running.service.workers[ALIAS].stats
    assert stats['sample_passes'] >= 1 and stats['train_passes'] >= 3
