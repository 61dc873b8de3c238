"""The ``twinkle_failure`` hook fires when a training step or a save of the Transformers backend fails: once per
failure, with the model, adapter, stage and step; the original exception propagates unchanged, even when a
notifier itself raises."""

from __future__ import annotations

import logging

import pytest
import torch
from row_helpers import labelled_rows

from twinkle_core import hooks
from twinkle_core.model.step_errors import MixedStepError, TenantStepError
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.multi_lora import MultiLoraTransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')

LORA = {'r': 2, 'lora_alpha': 4}
CONTEXT_KEYS = {'where', 'model_id', 'model_class', 'adapter_name', 'stage', 'step'}


def ctx(model_dir, model_class: str, adapter_name, stage: str, step) -> dict:
    return {
        'where': 'transformers',
        'model_id': str(model_dir),
        'model_class': model_class,
        'adapter_name': adapter_name,
        'stage': stage,
        'step': step,
    }


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[BaseException, dict]] = []

    @hooks.hook
    def twinkle_failure(self, exc, context):
        self.events.append((exc, context))


class BrokenNotifier:
    @hooks.hook
    def twinkle_failure(self, exc, context):
        raise RuntimeError('notifier down')


class ExitingNotifier:
    @hooks.hook
    def twinkle_failure(self, exc, context):
        raise SystemExit('notifier called sys.exit')


@pytest.fixture()
def recorder():
    # The misbehaving notifiers are registered first: call_each calls the last registered first, so the
    # recorder runs before ExitingNotifier's SystemExit ends the notification.
    plugins = [ExitingNotifier(), BrokenNotifier(), Recorder()]
    for p in plugins:
        hooks.register_hooks(p)
    yield plugins[-1]
    for p in plugins:
        hooks.unregister_hooks(p)


class BadLoss(Exception):
    pass


def raising_loss(inputs, outputs, **kwargs):
    raise BadLoss('loss exploded')


def test_transformers_model_step_and_save_failures_fire_the_hook(tiny_model_dir, tmp_path, recorder, caplog):
    model = TransformersModel(tiny_model_dir, device='cpu')
    model.add_adapter_to_model('sft', LORA)
    model.set_optimizer('AdamW', lr=1e-3)
    model.forward_backward(inputs=labelled_rows(0))
    model.clip_grad_and_step()
    model.save('ok', output_dir=str(tmp_path))
    assert recorder.events == []  # success fires nothing

    model.set_loss(raising_loss)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(BadLoss, match='loss exploded') as info:
            model.forward_backward(inputs=labelled_rows(1))
    ((exc, context),) = recorder.events  # once: the inner forward/calculate_loss/backward do not fire again
    assert exc is info.value and type(exc) is BadLoss and exc.args == ('loss exploded',)
    assert info.traceback[-1].name == 'raising_loss'  # the original traceback, not a re-raise from the hook
    assert set(context) == CONTEXT_KEYS
    assert context == ctx(tiny_model_dir, 'TransformersModel', 'sft', 'forward_backward', 1)
    assert 'notifier down' in caplog.text and 'notifier called sys.exit' in caplog.text  # logged, not raised

    recorder.events.clear()
    with pytest.raises(BadLoss):  # the three-call form reports the call that failed
        model.forward(inputs=labelled_rows(2))
        model.calculate_loss()
    assert [c['stage'] for _, c in recorder.events] == ['calculate_loss']

    recorder.events.clear()
    blocker = tmp_path / 'not-a-dir'
    blocker.write_text('a file where the checkpoint folder should go')
    with pytest.raises(OSError) as info:
        model.save('final', output_dir=str(blocker / 'sub'))
    ((exc, context),) = recorder.events
    assert exc is info.value
    assert context == ctx(tiny_model_dir, 'TransformersModel', 'sft', 'save', 1)


class ExplodingSGD(torch.optim.SGD):
    def step(self, closure=None):
        raise RuntimeError('optimizer exploded')


def test_optimizer_step_failure_fires_the_hook(tiny_model_dir, recorder):
    model = TransformersModel(tiny_model_dir, device='cpu')  # full-parameter training: no adapter
    model.set_optimizer(ExplodingSGD, lr=0.1)
    with pytest.raises(RuntimeError, match='optimizer exploded') as info:
        model.clip_grad_and_step()
    with pytest.raises(RuntimeError, match='optimizer exploded'):
        model.step()
    assert [e for e, _ in recorder.events][0] is info.value
    assert [c for _, c in recorder.events] == [
        ctx(tiny_model_dir, 'TransformersModel', None, stage, 0) for stage in ('clip_grad_and_step', 'step')
    ]


def test_multi_lora_failures_fire_the_hook(tiny_model_dir, tmp_path, recorder):
    engine = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    for name in ('alice', 'bob'):
        engine.add_adapter_to_model(name, LORA)
        engine.set_optimizer('AdamW', lr=1e-3, adapter_name=name)
    engine.forward_backward(inputs=labelled_rows(0), adapter_name='alice')
    engine.clip_grad_and_step(adapter_name='alice')
    engine.set_loss(raising_loss, adapter_name='alice')

    with pytest.raises(TenantStepError, match='loss exploded') as info:
        engine.forward_backward(inputs=labelled_rows(1), adapter_name='alice')
    ((exc, context),) = recorder.events
    assert exc is info.value
    assert context == ctx(tiny_model_dir, 'MultiLoraTransformersModel', 'alice', 'forward_backward', 1)

    recorder.events.clear()
    with pytest.raises(MixedStepError) as info:  # bob's step happened; alice's failure is the call's error
        engine.forward_backward(inputs={'alice': labelled_rows(2), 'bob': labelled_rows(3)})
    ((exc, context),) = recorder.events
    assert exc is info.value and set(exc.errors) == {'alice'}
    assert context['stage'] == 'forward_backward' and context['adapter_name'] is None and context['step'] is None

    recorder.events.clear()  # errors returned as data (what a server does per tenant) fire nothing here
    out = engine.forward_backward(inputs={'alice': labelled_rows(4), 'bob': labelled_rows(5)}, return_errors=True)
    assert 'error' in out['alice'] and 'loss' in out['bob'] and recorder.events == []

    blocker = tmp_path / 'not-a-dir'
    blocker.write_text('')
    with engine.adapter('bob'), pytest.raises(OSError) as info:
        engine.save('bob-final', output_dir=str(blocker))
    ((exc, context),) = recorder.events
    assert exc is info.value
    assert context == ctx(tiny_model_dir, 'MultiLoraTransformersModel', 'bob', 'save', 0)


def test_unregistered_notifier_is_not_called(tiny_model_dir):
    seen = Recorder()
    hooks.register_hooks(seen)
    hooks.unregister_hooks(seen)
    model = TransformersModel(tiny_model_dir, device='cpu')
    model.set_optimizer(ExplodingSGD, lr=0.1)
    with pytest.raises(RuntimeError, match='optimizer exploded'):
        model.step()
    assert seen.events == []
