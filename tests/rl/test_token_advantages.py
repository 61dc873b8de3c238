"""GAE and REINFORCE++ advantages against closed forms in float64, DAPO's overlong penalty and dynamic sampling.

References: GAE's closed form ``A_t = sum_l (gamma*lam)^l delta_{t+l}`` (Schulman et al., 2016, eq. 16), which
TRL's PPO computes by the backward recursion (``trl/trainer/ppo_trainer.py``, ``lastgaelam``); REINFORCE++ as
OpenRLHF computes it (``openrlhf/trainer/ppo_utils/experience_maker.py``: ``get_cumulative_returns`` then the
advantages normalised over every action token of the batch with the population variance)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from twinkle_core.advantage.token_level import GAEAdvantage, ReinforcePlusPlusAdvantage
from twinkle_core.errors import InvalidInputError
from twinkle_core.reward.length import OverlongPenaltyReward
from twinkle_core.rl.dynamic_sampling import fill_informative_groups


def episodes(seed: int):
    rng = random.Random(seed)
    lengths = [5, 1, 3, 7]
    rewards = [rng.uniform(-1, 2) for _ in lengths]
    values = [[rng.uniform(-1, 1) for _ in range(n)] for n in lengths]
    kl = [[rng.uniform(-0.2, 0.5) for _ in range(n)] for n in lengths]
    return rewards, values, kl


def gae_closed_form(reward, values, kl, kl_coef, gamma, lam):
    n = len(values)
    r = torch.tensor([-kl_coef * k for k in kl], dtype=torch.float64)
    r[-1] += reward
    v = torch.tensor(values + [0.0], dtype=torch.float64)
    delta = r + gamma * v[1:] - v[:-1]
    adv = torch.stack([sum((gamma * lam) ** k * delta[t + k] for k in range(n - t)) for t in range(n)])
    return adv, adv + v[:-1]


@pytest.mark.parametrize('gamma, lam, kl_coef', [(1.0, 0.95, 0.0), (0.9, 0.8, 0.1), (1.0, 1.0, 0.05), (0.99, 0.0, 0.2)])
def test_gae_matches_the_closed_form(gamma, lam, kl_coef):
    rewards, values, kl = episodes(seed=0)
    out = GAEAdvantage(gamma, lam, whiten=False)(rewards, values=values, kl=kl, kl_coef=kl_coef)
    for i, (reward, v, k) in enumerate(zip(rewards, values, kl)):
        want_adv, want_ret = gae_closed_form(reward, v, k, kl_coef, gamma, lam)
        torch.testing.assert_close(torch.tensor(out[i], dtype=torch.float64), want_adv, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.tensor(out.returns[i], dtype=torch.float64), want_ret, rtol=1e-12, atol=1e-12)
    if lam == 1.0 and gamma == 1.0:  # Monte-Carlo: the return is the sum of the rewards still to come
        r = [-kl_coef * x for x in kl[0]]
        r[-1] += rewards[0]
        assert out.returns[0] == pytest.approx([sum(r[t:]) for t in range(len(r))], abs=1e-12)


def test_gae_whitening_normalises_over_every_token_of_the_call():
    rewards, values, _ = episodes(seed=1)
    raw = GAEAdvantage(whiten=False)(rewards, values=values)
    white = GAEAdvantage()(rewards, values=values)
    flat_raw = torch.tensor([x for a in raw for x in a], dtype=torch.float64)
    flat = torch.tensor([x for a in white for x in a], dtype=torch.float64)
    torch.testing.assert_close(flat, (flat_raw - flat_raw.mean()) / flat_raw.std(unbiased=False))
    assert white.returns == raw.returns  # the critic's targets are never whitened
    kept_mean = GAEAdvantage(shift_mean=False)(rewards, values=values)
    torch.testing.assert_close(
        torch.tensor([x for a in kept_mean for x in a], dtype=torch.float64), flat_raw / flat_raw.std(unbiased=False)
    )


def openrlhf_reinforce(rewards, kl, kl_coef, gamma, group_size=None):
    """OpenRLHF: (reinforce_baseline) rewards minus the group mean; per-token rewards -kl_coef*kl with the reward
    added at the last action token; cumulative discounted returns; (x - mean) / sqrt(var) over all tokens."""
    rewards = torch.tensor(rewards, dtype=torch.float64)
    if group_size:
        rewards = (rewards.view(-1, group_size) - rewards.view(-1, group_size).mean(-1, keepdim=True)).view(-1)
    returns = []
    for reward, k in zip(rewards, kl):
        r = -kl_coef * torch.tensor(k, dtype=torch.float64)
        r[-1] += reward
        g, running = torch.zeros_like(r), 0.0
        for t in reversed(range(len(r))):
            running = r[t] + gamma * running
            g[t] = running
        returns.append(g)
    flat = torch.cat(returns)
    mean, var = flat.mean(), ((flat - flat.mean()) ** 2).mean()
    return [(g - mean) / var.sqrt() for g in returns], returns


@pytest.mark.parametrize('gamma, kl_coef, group', [(1.0, 0.0, None), (0.95, 0.1, None), (1.0, 0.05, 2)])
def test_reinforce_plus_plus_matches_openrlhf(gamma, kl_coef, group):
    rewards, _, kl = episodes(seed=2)
    fn = ReinforcePlusPlusAdvantage(gamma, baseline='group' if group else 'none')
    out = fn(rewards, kl=kl, kl_coef=kl_coef, group_size=group)
    want, want_returns = openrlhf_reinforce(rewards, kl, kl_coef, gamma, group)
    for got, w, got_ret, w_ret in zip(out, want, out.returns, want_returns):
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), w, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.tensor(got_ret, dtype=torch.float64), w_ret, rtol=1e-12, atol=1e-12)


def test_token_advantages_refuse_bad_input():
    rewards, values, kl = episodes(seed=3)
    with pytest.raises(InvalidInputError, match='GAEAdvantage needs values='):
        GAEAdvantage()(rewards)
    with pytest.raises(InvalidInputError, match='completion 2 has 3 tokens but 2 kl values'):
        GAEAdvantage()(rewards, values=values, kl=[kl[0], kl[1], kl[2][:2], kl[3]], kl_coef=0.1)
    with pytest.raises(InvalidInputError, match='reward 1 is nan'):
        ReinforcePlusPlusAdvantage()([1.0, float('nan')])
    with pytest.raises(InvalidInputError, match="baseline='group'\\) needs group_size"):
        ReinforcePlusPlusAdvantage(baseline='group')(rewards)
    with pytest.raises(InvalidInputError, match='lam must be in \\[0, 1\\]'):
        GAEAdvantage(lam=1.5)


def test_overlong_penalty_follows_dapo():
    reward = OverlongPenaltyReward(max_length=20, buffer=8)
    trajectories = [{'messages': []}] * 6
    got = reward(trajectories, completion_lengths=[3, 12, 13, 16, 20, 21])
    assert got == pytest.approx([0.0, 0.0, -1 / 8, -4 / 8, -1.0, -1.0])
    assert OverlongPenaltyReward(20, 8, scale=0.5)(trajectories[:1], completion_lengths=[30]) == [-0.5]
    with pytest.raises(InvalidInputError, match='needs completion_lengths='):
        reward(trajectories)
    with pytest.raises(InvalidInputError, match='buffer <= max_length'):
        OverlongPenaltyReward(4, 8)


@dataclass
class Group:
    rewards: list[float]


def test_dynamic_sampling_keeps_the_batch_full_of_informative_groups():
    """Groups whose rewards all agree never reach the batch; draws continue until it is full; the counts add up."""
    rng = random.Random(0)
    asked = []

    def draw(n):
        asked.append(n)
        return [Group([float(rng.random() < 0.3) for _ in range(4)]) for _ in range(n)]

    kept, stats = fill_informative_groups(draw, 8, max_draws=50)
    assert len(kept) == 8 and stats.full and all(max(g.rewards) > min(g.rewards) for g in kept)
    assert stats.drawn == sum(asked) == stats.kept + stats.dropped + stats.surplus and stats.dropped > 0
    assert asked[0] == 8 and all(n <= 8 for n in asked)  # asks for what is missing
    assert stats.as_metrics()['dynamic_sampling/dropped'] == stats.dropped


def test_dynamic_sampling_stops_at_its_cap_and_says_so(caplog):
    kept, stats = fill_informative_groups(lambda n: [Group([1.0, 1.0])] * n, 4, max_draws=3)
    assert kept == [] and not stats.full and stats.draws == 3 and stats.dropped == 12
    assert 'dynamic sampling: 0 of 4 groups' in caplog.text
