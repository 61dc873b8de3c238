"""Bad request values answered 400 naming what is wrong, through the clients users run: the unmodified tinker SDK
(optimizer hyper-parameters, checkpoint names) and the native twinkle client (`save` arguments, checkpoint names).
Config files: tests/server/test_config_file.py."""

from __future__ import annotations

import math
import time

import pytest
import tinker
from server_names import MODEL
from tinker import types

#: names no checkpoint may have: blank, or with control characters (they would name odd directories and garble
#: listings and terminals)
BAD_NAMES = ['', '   ', 'a\nb', 'a\x00b', 'a\tb', '\x1b[31m', 'a\x7fb', 'a\u2028b']
NAME_RULE = r'invalid checkpoint name .*(blank|control characters)|needs a checkpoint name|needs `path`'

#: AdamParams fields out of range -> the field the 400 must name
BAD_ADAM = [
    ({'learning_rate': 3e38}, 'learning_rate'),
    ({'learning_rate': 1e300}, 'learning_rate'),
    ({'learning_rate': 11.0}, 'learning_rate'),
    ({'learning_rate': math.nan}, 'learning_rate'),
    ({'beta1': 1.0}, 'beta1'),
    ({'beta1': -0.1}, 'beta1'),
    ({'beta2': 1.5}, 'beta2'),
    ({'beta2': math.inf}, 'beta2'),
    ({'eps': 0.0}, 'eps'),
    ({'eps': -1e-8}, 'eps'),
    ({'eps': 1e300}, 'eps'),
    ({'weight_decay': -0.1}, 'weight_decay'),
    ({'weight_decay': 1e30}, 'weight_decay'),
    ({'grad_clip_norm': -1.0}, 'grad_clip_norm'),
    ({'grad_clip_norm': math.nan}, 'grad_clip_norm'),
]


def _step(tc, data, adam: types.AdamParams) -> None:
    tc.forward_backward(data, 'cross_entropy').result()
    tc.optim_step(adam).result()


# ---- tinker SDK ------------------------------------------------------------------------------------------------------
def test_adam_params_out_of_range_are_refused_naming_the_field(service_client, sft_data):
    """A learning rate past float32's range (3e38, 1e300) was a 500 from inside the optimizer; every field out of its
    range is a 400 naming the field and its range, answered at once, and the adapter keeps training."""
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=11).result()
    tc.forward_backward(sft_data, 'cross_entropy').result()
    for fields, name in BAD_ADAM:
        started = time.monotonic()
        # (the SDK sends NaN and infinity as null: "not a valid number")
        with pytest.raises(
            tinker.BadRequestError,
            match=rf'adam_params\.({name} must be a finite number in [\[(]|'
            rf'AdamParams\.{name}: Input should be a valid number)',
        ):
            tc.optim_step(types.AdamParams(**{'learning_rate': 1e-3, **fields})).result()
        assert time.monotonic() - started < 10, fields
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # the pending gradients still step
    _step(
        tc, sft_data, types.AdamParams(learning_rate=10.0, beta1=0.0, eps=1.0, weight_decay=10.0, grad_clip_norm=1e30)
    )  # the ends of the ranges are allowed


def test_blank_and_control_character_checkpoint_names_are_refused_by_the_sdk(server, alice, service_client):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=12).result()
    for name in BAD_NAMES:
        for save in (tc.save_state, tc.save_weights_for_sampler):
            with pytest.raises(tinker.BadRequestError, match=NAME_RULE):
                save(name).result()
    path = tc.save_state('fine name-1').result().path
    assert path.endswith('/weights/fine name-1')
    rest = tinker.RestClient(base_url=server.base_url, api_key=alice)
    listed = [c.checkpoint_id for c in rest.list_checkpoints(tc.model_id).result().checkpoints]
    assert listed == ['weights/fine name-1']


# ---- native client ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def native_model(server, alice):
    from twinkle_client import MultiLoraTransformersModel, init_twinkle_client

    client = init_twinkle_client(base_url=server.base_url, api_key=alice)
    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('inputs', {'r': 2})
    yield model
    client.close()


def test_native_save_refuses_unknown_keyword_arguments(native_model):
    """`save(name, token=..., repo=...)` silently ignored both; now every argument a remote save cannot honour is
    named, with the ones it accepts."""
    from twinkle_client import RemoteInputError

    with pytest.raises(
        RemoteInputError,
        match=r'unknown keyword argument\(s\) repo, token; a remote save accepts '
        r'name, save_optimizer, hub_push',
    ):
        native_model.save('kw', token='x', repo='y', adapter_name='inputs')
    with pytest.raises(RemoteInputError, match='unknown keyword argument.*output_dir'):
        native_model.save('kw', output_dir='/tmp/elsewhere', adapter_name='inputs')
    with pytest.raises(RemoteInputError, match="save_optimizer must be true or false, got 'yes'"):
        native_model.save('kw', save_optimizer='yes', adapter_name='inputs')
    with pytest.raises(RemoteInputError, match='one positional argument'):
        native_model.save('kw', True, adapter_name='inputs')
    path = native_model.save(name='kw', save_optimizer=True, hub_push=False, adapter_name='inputs')
    assert path.startswith('twinkle://') and path.endswith('/weights/kw')


def test_blank_and_control_character_checkpoint_names_are_refused_by_the_native_client(native_model):
    from twinkle_client import RemoteInputError

    for name in BAD_NAMES:
        with pytest.raises(RemoteInputError, match=NAME_RULE):
            native_model.save(name, adapter_name='inputs')
    assert native_model.save('still fine', adapter_name='inputs').endswith('/weights/still fine')
