"""The names and call forms the Twinkle documents use, with `twinkle` renamed to `twinkle_core`: each is one
implementation behind two names (ours and the documents'), and does what the documents mean."""

from __future__ import annotations

import logging

import pytest
from core_helpers import run_twinkle
from uninstalled_index import UNINSTALLED_DIST, UNINSTALLED_INDEX, UNINSTALLED_KIND, UNINSTALLED_NAME


def test_module_paths_of_the_documents_import_our_components():
    from twinkle_core.data_format import SamplingParams
    from twinkle_core.dataloader import DataLoader
    from twinkle_core.dataset import DataLoader as OurDataLoader
    from twinkle_core.model import Model, TwinkleModel
    from twinkle_core.preprocessor.llm import GSM8KProcessor
    from twinkle_core.processor import InputProcessor
    from twinkle_core.registry import resolve_class
    from twinkle_core.types import SamplingParams as OurSamplingParams

    assert DataLoader is OurDataLoader and SamplingParams is OurSamplingParams and TwinkleModel is Model
    assert GSM8KProcessor is resolve_class('preprocessor', 'GSM8KProcessor')
    assert resolve_class('processor', 'InputProcessor') is resolve_class('processor', 'CausalLMProcessor')
    assert issubclass(resolve_class('processor', 'InputProcessor'), InputProcessor)
    qwen3_5 = resolve_class('template', 'Qwen3_5Template')  # ChatML + thinking switch, and images
    assert issubclass(qwen3_5, resolve_class('template', 'VisionTemplate')) and qwen3_5.images_optional


def test_aliases_are_listed_by_the_cli():
    out = run_twinkle('plugins', 'list', '--kind', 'processor')
    assert out.returncode == 0 and 'InputProcessor' in out.stdout and 'CausalLMProcessor' in out.stdout


def test_an_uninstalled_backend_fails_the_import_with_the_pip_line(registry_dir):
    import twinkle_core.model  # importing the module itself never fails

    registry_dir(UNINSTALLED_INDEX)  # a made-up model the index knows and no environment installs
    assert (UNINSTALLED_KIND, UNINSTALLED_NAME) == ('model', 'DeepSpeedModel')  # as the import below spells it
    with pytest.raises(ImportError, match=f'pip install {UNINSTALLED_DIST}'):
        from twinkle_core.model import DeepSpeedModel  # noqa: F401
    assert not hasattr(twinkle_core.model, 'NoSuchModel')  # unknown names stay AttributeErrors


def test_root_helpers(monkeypatch):
    import twinkle_core
    from twinkle_core import DeviceMesh, get_device_placement, get_logger, init_tinker_client

    logger = get_logger()
    assert logger.name == 'twinkle' and get_logger('grpo').name == 'twinkle.grpo'
    assert logging.getLogger('twinkle').handlers or logging.getLogger().handlers
    twinkle_core.initialize('local', global_device_mesh=DeviceMesh.from_sizes(dp_size=1, device_type='cpu'))
    try:
        placement = get_device_placement()
    finally:
        twinkle_core.shutdown()
    assert (
        'runtime: local' in placement
        and "global mesh: DeviceMesh(single, world_size=1, device_type='cpu')" in placement
    )
    monkeypatch.delenv('TINKER_BASE_URL', raising=False)
    tinker = init_tinker_client(base_url='http://127.0.0.1:9', api_key='tml-x')
    import os

    assert tinker.__name__ == 'tinker' and os.environ['TINKER_BASE_URL'] == 'http://127.0.0.1:9'
    with pytest.raises(AttributeError):
        twinkle_core.no_such_helper  # noqa: B018


def test_input_feature_to_datum_is_the_inverse_of_what_the_server_reads(tiny_model_dir):
    pytest.importorskip('tinker')
    from twinkle_core.server.common import input_feature_to_datum
    from twinkle_server.api.tinker.datums import to_rows
    from twinkle_server.api.tinker.wire import WireDatum
    from twinkle_server.service.images import encoder_for

    row = {'input_ids': [5, 6, 7, 8, 9], 'labels': [-100, -100, 7, 8, 9]}
    datum = input_feature_to_datum(row)
    assert datum.model_input.to_ints() == [5, 6, 7, 8]
    assert datum.loss_fn_inputs['weights'].to_numpy().tolist() == [0.0, 1.0, 1.0, 1.0]
    wire = WireDatum([datum.model_input.to_ints()], {k: v.to_numpy() for k, v in datum.loss_fn_inputs.items()})
    back = to_rows([wire], 'cross_entropy', encoder_for('tiny', str(tiny_model_dir)))[0]
    assert back['input_ids'] == row['input_ids'] and back['weights'][1:] == [0.0, 1.0, 1.0, 1.0]


def test_ding_notifier_is_the_dingtalk_webhook():
    from twinkle_core import DingNotifier, WebhookNotifier

    notifier = DingNotifier('https://oapi.example/robot/send?access_token=x', secret='SEC')
    assert isinstance(notifier, WebhookNotifier) and notifier.format == 'dingtalk' and notifier.secret == 'SEC'


def test_processor_and_template_call_forms(tiny_model_dir):
    from twinkle_core.errors import InvalidInputError
    from twinkle_core.processor import InputProcessor
    from twinkle_core.registry import resolve

    model = resolve('model', 'TransformersModel', model_id=str(tiny_model_dir), device='cpu')
    model.set_processor(InputProcessor)  # the interface itself: the default processor
    assert type(model.state.processor).__name__ == 'CausalLMProcessor'
    model.set_processor('InputProcessor', padding_free=True, padding_side='right')
    assert model.state.processor.padding_free
    with pytest.raises(InvalidInputError, match="padding_side='left'"):
        model.set_processor('InputProcessor', padding_side='left')
    model.set_template('Qwen3_5Template', model_id=str(tiny_model_dir))  # a text-only checkpoint: text only
    template = model.state.template
    assert type(template).__name__ == 'Qwen3_5Template' and template.text_only_reason
    row = {'messages': [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'yo'}]}
    text = resolve('template', 'Qwen3Template', model_id_or_tokenizer=str(tiny_model_dir))
    assert template.encode(row) == text.encode(row)
    with pytest.raises(InvalidInputError, match='image'):
        template.encode({**row, 'images': [b'png'], 'messages': [{'role': 'user', 'content': '<image>hi'}]})


def test_a_dataloader_over_a_dataset_factory():
    from twinkle_core.dataloader import DataLoader

    calls = []

    def make():
        calls.append(1)
        return [{'input_ids': [i, i + 1]} for i in range(5)]

    loader = DataLoader(dataset=make, batch_size=2, min_batch_size=2)
    assert calls == [1] and [len(b) for b in loader] == [2, 2]
