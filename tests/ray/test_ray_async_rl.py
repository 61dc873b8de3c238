"""Asynchronous RL with the sampler in a Ray actor group and the trainer in this process: the weights travel to
the actor between its calls, and when the actor dies mid-run the group is restarted and the run goes on."""

from __future__ import annotations

from typing import Any

import pytest

import twinkle_core
from tests.rl.test_examples import load_example
from tests.rl.test_off_policy_stats import ParityRewards
from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.fixtures.repeat_task import RepeatTaskWorker
from twinkle_core.mesh import DeviceGroup
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl import AsyncRLDriver, PolicyGradientStep, RolloutContext, RolloutGroup
from twinkle_core.runtime.context import current_runtime

PROMPTS = 3


@pytest.mark.slow
@pytest.mark.parametrize('trainer', ['local', 'ray'])
def test_the_sampler_actor_dies_mid_run_and_is_restarted(ray_cluster, tiny_model_dir, trainer: str) -> None:
    import ray

    groups = [DeviceGroup(name='sampler', ranks=1)] + ([DeviceGroup(name='model', ranks=1)] if trainer == 'ray' else [])
    twinkle_core.initialize(mode='ray', groups=groups)
    try:
        model = TransformersModel(model_id=tiny_model_dir, **({'remote_group': 'model'} if trainer == 'ray' else {}))
        model.set_optimizer('AdamW', lr=1e-3)
        model.set_loss('GRPOLoss')
        template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir))
        built: list[Any] = []

        class KilledOnCall1:
            """The first worker: its actor is killed just before call 1 samples (a crash mid-run)."""

            def __init__(self, inner: RepeatTaskWorker) -> None:
                self.inner, self.sampler = inner, inner.sampler

            def __call__(self, context: RolloutContext) -> list[RolloutGroup]:
                if context.call_index == 1:
                    ray.kill(current_runtime().group('sampler').workers[0], no_restart=True)
                return self.inner(context)

        def new_worker() -> Any:
            if built:
                current_runtime().reset_group('sampler')
            sampler = resolve_class('sampler', 'TorchSampler')(model_id=str(tiny_model_dir), remote_group='sampler')
            worker = RepeatTaskWorker(sampler, template, prompts_per_call=PROMPTS, group_size=4, seed=1)
            built.append(KilledOnCall1(worker) if not built else worker)
            return built[-1]

        train_step = PolicyGradientStep(model, GRPOAdvantage(scale='group'))
        driver = AsyncRLDriver(model, new_worker, train_step, groups_per_step=PROMPTS, max_staleness=1)
        report = driver.run(3)
        assert report.worker_restarts == 1 and len(built) == 2
        assert [len(r.versions) for r in report.steps] == [PROMPTS] * 3
        assert all(max(r.staleness) <= 1 for r in report.steps)
        assert driver.weights.sampler_version >= 1  # the new actor runs trained weights, sent in full
    finally:
        twinkle_core.shutdown()


@pytest.mark.slow
def test_trainer_and_sampler_groups_train_like_a_local_run(ray_cluster, tiny_model_dir) -> None:
    """Both sides as Ray groups (the seeds' layout): a one-rank training group and a one-rank sampler group, the
    published weights going from the training actor through this process to the sampler actor. With
    max_staleness=0 and seeded sampling the run is deterministic: it samples the same completions, gets the same
    rewards and sees the same ratios as the same run with both sides in this process; with max_staleness=1 the
    sampler group samples the next step's groups while the training group trains."""

    def run(remote: bool, max_staleness: int = 0) -> tuple[Any, int]:
        model = TransformersModel(model_id=tiny_model_dir, **({'remote_group': 'model'} if remote else {}))
        model.set_optimizer('AdamW', lr=1e-3)
        model.set_loss('GRPOLoss')
        template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir))

        def new_worker() -> ParityRewards:
            extra = {'remote_group': 'sampler'} if remote else {}
            sampler = resolve_class('sampler', 'TorchSampler')(model_id=str(tiny_model_dir), **extra)
            return ParityRewards(RepeatTaskWorker(sampler, template, prompts_per_call=PROMPTS, group_size=4, seed=2))

        step = PolicyGradientStep(model, GRPOAdvantage(scale='group'))
        driver = AsyncRLDriver(model, new_worker, step, groups_per_step=PROMPTS, max_staleness=max_staleness)
        try:
            return driver.run(4), driver.weights.sampler_version
        finally:
            driver.close()

    local, _ = run(remote=False)
    twinkle_core.initialize(
        mode='ray', groups=[DeviceGroup(name='model', ranks=1), DeviceGroup(name='sampler', ranks=1)]
    )
    try:
        remote, sampler_version = run(remote=True)
        overlapped, _ = run(remote=True, max_staleness=1)  # and asynchronously
    finally:
        twinkle_core.shutdown()
    assert sampler_version == 4  # every version went into the sampler actor as it was published, the last one too
    rewards = [r.metrics['reward'] for r in remote.steps]
    assert rewards == [r.metrics['reward'] for r in local.steps] and len(set(rewards)) > 1
    for got, want in zip(remote.steps, local.steps):  # same data, same ratios: the weights travelled intact
        assert got.metrics['is_ratio_mean'] == pytest.approx(want.metrics['is_ratio_mean'], abs=1e-5)
    assert [max(r.staleness) for r in overlapped.steps][1:] == [1, 1, 1]  # the sampler ran one version ahead


@pytest.mark.slow
def test_the_example_runs_with_both_sides_on_ray(ray_cluster) -> None:
    try:
        result = load_example('async_grpo').main(
            steps=4, warmup_steps=2, prompts_per_step=2, group_size=4, ray=True, ray_trainer=True
        )
    finally:
        twinkle_core.shutdown()
    report = result['report']
    assert len(report.steps) == 4 and report.dropped == 0 and result['sampler_version'] == 4
    assert all(max(r.staleness) <= 1 for r in report.steps)
