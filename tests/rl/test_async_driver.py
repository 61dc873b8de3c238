"""`AsyncRLDriver` on the tiny fixture model with real samplers: max_staleness=0 is the synchronous loop bit for bit,
the staleness bound holds while the worker runs ahead, a failing worker is rebuilt, weights reach the sampler."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.fixtures.repeat_task import RepeatTaskWorker
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl import (
    AsyncRLDriver,
    PolicyGradientStep,
    PolicyWeights,
    RolloutContext,
    RolloutGroup,
    run_with_progress,
)
from twinkle_core.weight_sync import CheckpointEngineManager

PROMPTS, GROUP = 3, 4


def new_model(model_dir: Any) -> TransformersModel:
    model = TransformersModel(model_id=model_dir)
    model.set_optimizer('AdamW', lr=1e-3)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28)
    return model


def new_sampler(model: TransformersModel) -> Any:
    return resolve_class('sampler', 'TorchSampler')(model_id=model.model_dir)


def trainer(model: TransformersModel, before: Any = None) -> Any:
    step_fn = PolicyGradientStep(model, GRPOAdvantage(scale='group'), max_norm=1.0)

    def train_step(groups: list[RolloutGroup], step: int) -> dict[str, Any]:
        if before is not None:
            before(step)
        return step_fn(groups, step)

    return train_step


class FailsOnCalls:
    """A worker that raises on the given call indices (and otherwise is `inner`)."""

    def __init__(self, inner: Any, fail_on: set[int]) -> None:
        self.inner, self.sampler, self.fail_on = inner, inner.sampler, fail_on

    def __call__(self, context: RolloutContext) -> list[RolloutGroup]:
        if context.call_index in self.fail_on:
            raise RuntimeError(f'worker crashed on call {context.call_index}')
        return self.inner(context)


def worker_factory(model: TransformersModel, fail_on: set[int] | None = None) -> Any:
    """Builds RepeatWorkers on fresh samplers; with `fail_on`, the first one built fails on those calls."""
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    built: list[Any] = []

    def make() -> Any:
        worker = RepeatTaskWorker(
            new_sampler(model), template, prompts_per_call=PROMPTS, group_size=GROUP, seed=7, temperature=1.0
        )
        built.append(FailsOnCalls(worker, fail_on) if fail_on and not built else worker)
        return built[-1]

    return make


def test_max_staleness_0_is_the_synchronous_loop_bit_for_bit(tiny_model_dir):
    steps = 3
    # the synchronous loop: sync weights, sample, train -- one thread
    model = new_model(tiny_model_dir)
    worker = worker_factory(model)()
    sync = CheckpointEngineManager(model=model, sampler=worker.sampler)
    train_step = trainer(model)
    sync_rewards = []
    for step in range(steps):
        sync.sync_weights()
        groups = worker(RolloutContext(step, step, lambda v=step: v))
        sync_rewards.append(train_step(groups, step)['reward'])
    sync_state = {n: p.detach().clone() for n, p in model.model.named_parameters()}

    model = new_model(tiny_model_dir)
    driver = AsyncRLDriver(model, worker_factory(model), trainer(model), groups_per_step=PROMPTS, max_staleness=0)
    report = driver.run(steps)
    assert [r.metrics['reward'] for r in report.steps] == sync_rewards
    assert [r.staleness for r in report.steps] == [[0] * PROMPTS] * steps
    for name, param in model.model.named_parameters():
        assert torch.equal(param.detach(), sync_state[name]), name


def test_the_worker_runs_ahead_by_max_staleness_and_no_further(tiny_model_dir):
    model = new_model(tiny_model_dir)
    holder: dict[str, AsyncRLDriver] = {}

    def hold_first_step(step: int) -> None:
        if step == 0:  # let the worker produce everything the bound allows before the first update
            buffer = holder['driver'].buffer
            with buffer.cv:
                assert buffer.cv.wait_for(lambda: buffer.position() >= 3 * PROMPTS, timeout=60)

    driver = AsyncRLDriver(
        model,
        worker_factory(model),
        trainer(model, hold_first_step),
        groups_per_step=PROMPTS,
        groups_per_call=1,
        max_staleness=2,
    )
    holder['driver'] = driver
    report = driver.run(4)
    staleness = [max(r.staleness) for r in report.steps]
    assert staleness[:3] == [0, 1, 2]  # steps 1 and 2 trained groups of version 0 (sampled during step 0)
    assert max(staleness) <= 2 and report.dropped == 0
    assert report.summary()['staleness_max'] == 2


def test_a_failing_worker_is_rebuilt_and_the_run_goes_on(tiny_model_dir):
    model = new_model(tiny_model_dir)
    driver = AsyncRLDriver(
        model,
        worker_factory(model, fail_on={1}),
        trainer(model),
        groups_per_step=PROMPTS,
        max_staleness=1,
    )
    report = driver.run(3)
    assert report.worker_restarts == 1 and len(report.steps) == 3
    assert all(max(r.staleness) <= 1 for r in report.steps)
    assert driver.weights.sampler_version >= 1  # the rebuilt sampler got the trained weights, not the initial ones


def test_a_worker_that_keeps_failing_ends_the_run_with_its_error(tiny_model_dir):
    model = new_model(tiny_model_dir)
    failures = iter(range(100))

    class Broken:
        def __init__(self) -> None:
            self.sampler = new_sampler(model)

        def __call__(self, context: RolloutContext) -> list[RolloutGroup]:
            raise RuntimeError(f'boom {next(failures)}')

    driver = AsyncRLDriver(model, Broken, trainer(model), groups_per_step=1, max_worker_restarts=1)
    with pytest.raises(TwinkleError, match=r'failed 2 times \(max_worker_restarts=1\).*boom 1'):
        driver.run(2)


def test_published_weights_reach_the_sampler_between_calls(tiny_model_dir):
    model = new_model(tiny_model_dir)
    sampler = new_sampler(model)
    weights = PolicyWeights(model, sampler)
    model.set_loss('CrossEntropyLoss')
    model.forward_backward(inputs=[{'input_ids': [5, 6, 7, 8], 'labels': [-100, 6, 7, 8]}])
    model.clip_grad_and_step()
    weights.publish(1)
    trained = {n: p.detach().clone() for n, p in model.model.named_parameters()}
    model.forward_backward(inputs=[{'input_ids': [5, 6, 7, 8], 'labels': [-100, 6, 7, 8]}])
    model.clip_grad_and_step()  # version 2 is not published: the sampler must get version 1's weights
    assert weights.apply_latest() == 1 and weights.sampler_version == 1
    sampler_params = dict(sampler._model.named_parameters())
    assert all(torch.equal(sampler_params[n], t) for n, t in trained.items())
    assert weights.apply_latest() == 1  # nothing newer: nothing moves


def test_a_sampler_sharing_the_training_weights_is_refused(tiny_model_dir):
    model = new_model(tiny_model_dir)
    shared = resolve_class('sampler', 'TorchSampler')(model=model)
    with pytest.raises(InvalidInputError, match='needs a sampler with its own weights'):
        PolicyWeights(model, shared)


def test_publishing_never_waits_for_the_sampler(tiny_model_dir):
    model = new_model(tiny_model_dir)
    weights = PolicyWeights(model, new_sampler(model))
    done = threading.Event()
    threading.Thread(target=lambda: (weights.publish(0), weights.publish(1), done.set())).start()
    assert done.wait(timeout=30) and weights.latest_version == 1 and weights.sampler_version == -1


def test_a_driver_runs_once(tiny_model_dir):
    model = new_model(tiny_model_dir)
    driver = AsyncRLDriver(model, worker_factory(model), trainer(model), groups_per_step=PROMPTS, max_staleness=0)
    assert len(driver.run(1).steps) == 1
    with pytest.raises(TwinkleError, match='already called'):
        driver.run(1)


def test_run_with_progress_shows_the_metrics_and_closes_the_driver(tiny_model_dir, capsys):
    model = new_model(tiny_model_dir)
    driver = AsyncRLDriver(model, worker_factory(model), trainer(model), groups_per_step=PROMPTS, max_staleness=1)
    closed: list[bool] = []
    driver.close = lambda: closed.append(True)  # type: ignore[method-assign]
    report = run_with_progress(driver, 2, desc='test run', metrics=('reward', 'not-a-metric'))
    assert len(report.steps) == 2 and closed == [True]
    bar = capsys.readouterr().err
    assert 'test run' in bar and '2/2' in bar and 'reward=0.00' in bar and 'staleness=' in bar
    assert 'not-a-metric' not in bar


def test_an_evaluator_sees_each_policy_version_between_steps(tiny_model_dir, capsys):
    """The evaluator runs on the trainer's thread before the first step and after every eval_every-th step and the
    last: the trainer's weights are then exactly that version (checked against the published versions' sums)."""
    model = new_model(tiny_model_dir)
    driver = AsyncRLDriver(model, worker_factory(model), trainer(model), groups_per_step=PROMPTS, max_staleness=1)
    param = next(p for p in model.model.parameters() if p.requires_grad)
    seen: list[tuple[int, float, str]] = []

    def evaluator(version: int) -> dict[str, float]:
        seen.append((version, float(param.detach().double().sum()), threading.current_thread().name))
        return {'accuracy': version / 10}

    report = run_with_progress(driver, 5, desc='eval run', evaluator=evaluator, eval_every=2)
    assert [v for v, _, _ in seen] == [0, 2, 4, 5] and report.evaluations == [
        (v, {'accuracy': v / 10}) for v in (0, 2, 4, 5)
    ]
    assert {thread for _, _, thread in seen} == {threading.current_thread().name}  # never the rollout thread
    assert len({total for _, total, _ in seen}) == 4  # every evaluation saw other weights: a new version each
    assert 'policy version 4: eval accuracy 0.400' in capsys.readouterr().out
    with pytest.raises(InvalidInputError, match='eval_every must be >= 1'):
        AsyncRLDriver(model, worker_factory(model), trainer(model), groups_per_step=PROMPTS).run(1, evaluator=evaluator)


def test_a_policy_gradient_step_in_micro_batches_equals_one_pass(tiny_model_dir):
    """`PolicyGradientStep(micro_batch_size=...)`: the rows go in several passes, the update is that of one pass."""
    import torch

    groups = []
    for g in range(2):  # two groups of 3 completions of one prompt, rewards that differ within each group
        completions = [list(range(8 + i, 10 + 2 * i)) for i in range(3)]  # of 2, 3 and 4 tokens
        rows = [{'input_ids': [5, 6, 7 + g] + c, 'labels': [-100] * 3 + c} for c in completions]  # on-policy rows
        groups.append(RolloutGroup(rows=rows, rewards=[1.0, 0.0, 0.5]))
    updated = []
    for micro_batch_size in (None, 2):
        torch.manual_seed(0)
        model = new_model(tiny_model_dir)
        model.set_optimizer('SGD', lr=1.0)  # the update is the gradient itself (Adam's first step is ~ its sign)
        step = PolicyGradientStep(model, GRPOAdvantage(scale='group'), max_norm=None, micro_batch_size=micro_batch_size)
        metrics = step(groups, 0)
        assert metrics['reward'] == 0.5
        updated.append([p.detach().clone() for p in model.model.parameters()])
    start = new_model(tiny_model_dir).model.parameters()
    moved = max((a - b).abs().max().item() for a, b in zip(updated[0], start))
    assert moved > 1e-4  # the step did something
    assert max((a - b).abs().max().item() for a, b in zip(*updated)) < 1e-6 * max(1.0, moved)
    with pytest.raises(InvalidInputError, match='micro_batch_size'):  # the setting reaches the model
        PolicyGradientStep(new_model(tiny_model_dir), GRPOAdvantage(), micro_batch_size=0)(groups, 0)


def test_a_worker_that_would_not_sample_the_lora_policy_is_refused(tiny_model_dir):
    """A LoRA policy reaches the worker's own sampler as an adapter; a worker sampling with adapter_name=None would
    roll out the base model and train on its samples, silently. The driver refuses it, naming the fix."""
    model = new_model(tiny_model_dir)
    model.add_adapter_to_model('policy', {'r': 4, 'lora_alpha': 8})
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)

    def worker(adapter_name: str | None) -> Any:
        return lambda: RepeatTaskWorker(
            new_sampler(model), template, prompts_per_call=PROMPTS, group_size=GROUP, adapter_name=adapter_name
        )

    with pytest.raises(InvalidInputError, match=r"as adapter 'policy', but the worker samples with the base weights"):
        AsyncRLDriver(model, worker(None), trainer(model), groups_per_step=PROMPTS)
    with pytest.raises(InvalidInputError, match=r"samples with adapter 'other'.*adapter_name='policy'"):
        AsyncRLDriver(model, worker('other'), trainer(model), groups_per_step=PROMPTS)
    driver = AsyncRLDriver(model, worker('policy'), trainer(model), groups_per_step=PROMPTS)
    assert driver.weights.sampler_adapter == 'policy'
