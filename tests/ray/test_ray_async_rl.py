"""Asynchronous RL with the sampler in a Ray actor group and the trainer in this process: the weights travel to
the actor between its calls, and when the actor dies mid-run the group is restarted and the run goes on."""

from __future__ import annotations

from typing import Any

import pytest

import twinkle_core
from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.fixtures.repeat_task import RepeatTaskWorker
from twinkle_core.mesh import DeviceGroup
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl import AsyncRLDriver, PolicyGradientStep, RolloutContext, RolloutGroup
from twinkle_core.runtime.context import current_runtime

PROMPTS = 3


@pytest.mark.slow
def test_the_sampler_actor_dies_mid_run_and_is_restarted(ray_cluster, tiny_model_dir) -> None:
    import ray

    twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='sampler', ranks=1)])
    try:
        model = TransformersModel(model_id=tiny_model_dir)
        model.set_optimizer('AdamW', lr=1e-3)
        model.set_loss('GRPOLoss')
        template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
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
            sampler = resolve_class('sampler', 'TorchSampler')(model_id=model.model_dir, remote_group='sampler')
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
