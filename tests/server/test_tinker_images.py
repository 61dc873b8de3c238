"""Tinker `ImageChunk`s through the unmodified SDK against a real server hosting the tiny Qwen3-VL fixture.

Datums are built the tinker-cookbook way (`datum_from_model_input_weights`): a text chunk ending with
``<|vision_start|>``, an ImageChunk, a text chunk starting with ``<|vision_end|>``; the image occupies
`expected_tokens` positions of the loss inputs (target 0, weight 0). forward_backward travels as protobuf (SDK 0.38
has no JSON form for it); sampling prompts travel as JSON (image bytes base64).
"""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import tinker
import torch
from PIL import Image
from test_tinker_sdk import _train
from tinker import types
from vl_fixtures import VL, client, vl_server  # noqa: F401 (fixtures used by name)

from twinkle_core.fixtures.images import colour_image, colour_trajectories, image_bytes

RANK, SEED = 4, 11
ADAM = types.AdamParams(learning_rate=1e-2)
TOKENS_PER_IMAGE = 16  # a 112x112 image is resized to 128x128: 8x8 patches of 16 px, merged 2x2 -> 16 tokens


@pytest.fixture(scope='module')
def template(tiny_vl_model_dir):
    from twinkle_core.template.vision import VisionTemplate

    return VisionTemplate(str(tiny_vl_model_dir))


@pytest.fixture(scope='module')
def encoded(template):
    """(trajectory, VisionTemplate row) pairs of the colour task: the local reference rows."""
    trajectories = colour_trajectories(4)
    return [(t, template.encode(t)) for t in trajectories]


def model_input(row: dict, images: list[bytes], *, fmt: str = 'png') -> types.ModelInput:
    """A row's tokens as chunks: text runs, and one ImageChunk per run of image tokens (cookbook renderer shape)."""
    chunks, pos, k = [], 0, 0
    for is_image, run in itertools.groupby(row['mm_token_type_ids']):
        n = len(list(run))
        if is_image:
            chunks.append(types.ImageChunk(data=images[k], format=fmt, expected_tokens=n))
            k += 1
        else:
            chunks.append(types.EncodedTextChunk(tokens=row['input_ids'][pos : pos + n]))
        pos += n
    return types.ModelInput(chunks=chunks)


def to_datum(trajectory: dict, row: dict, **kwargs) -> types.Datum:
    from tinker_cookbook.supervised.common import datum_from_model_input_weights

    weights = torch.tensor([float(label != -100) for label in row['labels']])
    return datum_from_model_input_weights(model_input(row, trajectory['images'], **kwargs), weights)


@pytest.fixture(scope='module')
def data(encoded) -> list[types.Datum]:
    return [to_datum(t, r) for t, r in encoded]


def _local_reference(model_dir, rows: list[dict]) -> tuple[float, list[list[float]]]:
    """First loss and per-token log-probs (aligned with input_ids) of the same adapter (seed, rank, alpha, targets)
    in a local single-adapter TransformersModel."""
    from twinkle_server.engine.model_host.base import LoraSpec
    from twinkle_server.service.lora import lora_targets
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(str(model_dir), device='cpu')
    lora = LoraSpec(RANK, 32.0, lora_targets({}), SEED)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model.add_adapter_to_model('local', lora.peft_config())
    model.set_loss('CrossEntropyLoss', reduction='sum')
    logprobs = model.forward_only(inputs=[dict(r) for r in rows])['logprobs']
    return float(model.forward_backward(inputs=[dict(r) for r in rows])['loss']), logprobs


@pytest.fixture(scope='module')
def rows(encoded) -> list[dict]:
    return [{k: v for k, v in r.items() if k != 'ground_truth'} for _, r in encoded]


@pytest.fixture(scope='module')
def local(tiny_vl_model_dir, rows) -> tuple[float, list[list[float]]]:
    return _local_reference(tiny_vl_model_dir, rows)


def test_lora_training_with_images_matches_local_and_loss_falls(client, data, local):
    """(a)+(d)+(e, protobuf): cookbook-shaped image datums train; the first loss is the local model's."""
    assert all(isinstance(d.model_input.chunks[1], types.ImageChunk) for d in data)
    assert data[0].model_input.chunks[0].tokens[-1] == 1185  # <|vision_start|> ends the text before the image
    assert data[0].model_input.chunks[2].tokens[0] == 1186  # <|vision_end|> starts the text after it
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    before = tc.forward(data, 'cross_entropy').result()
    losses = _train(tc, data, 4, ADAM)
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.95 * losses[0], losses

    local_loss, local_logprobs = local
    assert losses[0] == pytest.approx(local_loss, abs=1e-4)
    for out, d, ref in zip(before.loss_fn_outputs, data, local_logprobs):
        # Tinker position i predicts input_ids[i + 1]: the local row's log-probs shifted by one (image positions
        # included: neither side trains on them, both report the next input token's log-prob)
        np.testing.assert_allclose(out['logprobs'].to_numpy(), ref[1 : d.model_input.length + 1], atol=1e-4)


def test_forward_logprobs_cover_every_position(client, data):
    """forward() returns one log-prob per Tinker position (image positions included) and loss = -sum(w * lp)."""
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    out = tc.forward(data, 'cross_entropy').result()
    expected = 0.0
    for o, d in zip(out.loss_fn_outputs, data):
        lp = o['logprobs'].to_numpy()
        assert len(lp) == d.model_input.length == len(d.loss_fn_inputs['target_tokens'].tolist())
        expected -= float(np.dot(lp, d.loss_fn_inputs['weights'].to_numpy()))
    assert out.metrics['loss:sum'] == pytest.approx(expected, rel=1e-4)


def test_expected_tokens_none_uses_the_server_count(client, data):
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    unset = [
        types.Datum(
            model_input=types.ModelInput(
                chunks=[
                    c.model_copy(update={'expected_tokens': None}) if isinstance(c, types.ImageChunk) else c
                    for c in d.model_input.chunks
                ]
            ),
            loss_fn_inputs=d.loss_fn_inputs,
        )
        for d in data
    ]
    with_none = tc.forward(unset, 'cross_entropy').result().metrics['loss:sum']
    assert with_none == pytest.approx(tc.forward(data, 'cross_entropy').result().metrics['loss:sum'], rel=1e-6)


def test_wrong_expected_tokens_is_a_400_and_the_client_goes_on(client, data):
    """(b) the 400 names the chunk and both counts; the refused seq_id does not block the next request."""
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    chunks = list(data[0].model_input.chunks)
    chunks[1] = chunks[1].model_copy(update={'expected_tokens': TOKENS_PER_IMAGE + 1})
    n = sum(c.length for c in chunks)
    bad = types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={'target_tokens': [0] * n, 'weights': [0.0] * n}
    )
    with pytest.raises(
        tinker.BadRequestError,
        match=rf'chunk 1 \(image\) has expected_tokens=17, but this server '
        rf'computes {TOKENS_PER_IMAGE} tokens',
    ):
        tc.forward_backward([bad], 'cross_entropy').result()
    assert _train(tc, data[:1], 1, ADAM)[0] > 0


@pytest.mark.parametrize(
    'payload,fmt,match',
    [
        (b'\x89PNG\r\n\x1a\nnot really', 'png', 'not a decodable image'),
        (image_bytes(colour_image('red'), 'JPEG'), 'png', 'the bytes are JPEG'),
        (image_bytes(colour_image('red'), 'GIF'), 'gif', "format 'gif' is not supported"),
    ],
    ids=['undecodable', 'format-mismatch', 'unknown-format'],
)
def test_bad_images_are_refused(client, data, payload, fmt, match):
    """(c) undecodable bytes and a format that does not match the bytes: 400, and the client goes on."""
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    chunks = list(data[0].model_input.chunks)
    # model_construct: the SDK's own validation would stop format='gif' before it is sent
    chunks[1] = types.ImageChunk.model_construct(data=payload, format=fmt, expected_tokens=TOKENS_PER_IMAGE)
    n = sum(c.length for c in chunks)
    bad = types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={'target_tokens': [0] * n, 'weights': [0.0] * n}
    )
    with pytest.raises(tinker.BadRequestError, match=match):
        tc.forward_backward([bad], 'cross_entropy').result()
    assert tc.forward(data[:1], 'cross_entropy').result().metrics['loss:sum'] > 0


def test_images_beyond_the_context_are_refused_before_decoding(client, data):
    """Image sizes come from the headers: a datum whose images cannot fit the context is a 413 (expected_tokens
    unset, so only the server's count tells), and so is a sampling prompt."""
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    big = types.ImageChunk(data=image_bytes(colour_image('blue', (224, 224))), format='png')  # 49 tokens each
    chunks = [types.EncodedTextChunk(tokens=[5, 6])] + [big] * 45  # 2207 positions > 2048
    n = 2 + 45 * 49
    datum = types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={'target_tokens': [0] * n, 'weights': [0.0] * n}
    )
    with pytest.raises(tinker.APIStatusError, match='context length') as refused:
        tc.forward_backward([datum], 'cross_entropy').result()
    assert refused.value.status_code == 413
    sampler = tc.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.UnprocessableEntityError, match='context length'):
        sampler.sample(types.ModelInput(chunks=chunks), 1, types.SamplingParams(max_tokens=2)).result()


def test_placeholder_token_in_text_is_refused(client, data):
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    tokens = [5, 6, 1187, 7]
    bad = types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={'target_tokens': [6, 1187, 7, 8], 'weights': [1.0] * 4},
    )
    with pytest.raises(tinker.BadRequestError, match='contains token id 1187, the image placeholder'):
        tc.forward_backward([bad], 'cross_entropy').result()


def test_jpeg_images_train_too(client, encoded):
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    jpegs = [(dict(t, images=[image_bytes(Image.open(io.BytesIO(t['images'][0])), 'JPEG')]), r) for t, r in encoded]
    out = tc.forward([to_datum(t, r, fmt='jpeg') for t, r in jpegs], 'cross_entropy').result()
    assert out.metrics['loss:sum'] > 0


def test_sampling_from_an_image_prompt(client, data):
    """(e, JSON) an image prompt reaches the sampler (asample carries the image as base64 in JSON) and is seen as
    the protobuf path sees it: its prompt log-probs equal the training forward's."""
    tc = client.create_lora_training_client(base_model=VL, rank=RANK, seed=SEED).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput(chunks=[*data[0].model_input.chunks[:2], types.EncodedTextChunk(tokens=[1186])])
    res = sampler.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=4, seed=3)).result()
    assert len(res.sequences) == 2 and all(len(s.tokens) == len(s.logprobs) > 0 for s in res.sequences)

    full, targets = data[0].model_input, data[0].loss_fn_inputs['target_tokens'].tolist()
    fwd = tc.forward(
        [types.Datum(model_input=full, loss_fn_inputs={'target_tokens': targets})], 'cross_entropy'
    ).result()
    whole = types.ModelInput(
        chunks=[*full.chunks[:2], types.EncodedTextChunk(tokens=[*full.chunks[2].tokens, targets[-1]])]
    )
    sampled = sampler.compute_logprobs(whole).result()
    assert len(sampled) == whole.length and sampled[0] is None
    np.testing.assert_allclose(sampled[1:], fwd.loss_fn_outputs[0]['logprobs'].to_numpy(), atol=1e-4)

    pointer = types.ModelInput(
        chunks=[types.ImageAssetPointerChunk(format='png', location='/etc/passwd', expected_tokens=TOKENS_PER_IMAGE)]
    )
    with pytest.raises(tinker.BadRequestError, match='image_asset_pointer chunks are not supported'):
        sampler.sample(pointer, num_samples=1, sampling_params=types.SamplingParams(max_tokens=2)).result()


def test_native_client_sends_image_rows(vl_server, rows, local):
    """The native client packs `pixel_values` as base64 float32 (not nested lists); the server unpacks them and
    trains on exactly the local rows."""
    from twinkle_client import MultiLoraTransformersModel, TwinkleClient
    from twinkle_client.proxy import plain
    from twinkle_core.utils.arrays import ARRAY_KEY

    assert ARRAY_KEY in plain(rows)[0]['pixel_values']
    running, key = vl_server
    conn = TwinkleClient(running.base_url, key)
    try:
        model = MultiLoraTransformersModel(model_id=VL, client=conn)
        model.add_adapter_to_model('native', {'r': RANK, 'lora_alpha': 32.0, 'seed': SEED})
        model.set_loss('CrossEntropyLoss', reduction='sum', adapter_name='native')
        assert model.forward_backward(inputs=rows, adapter_name='native')['loss'] == pytest.approx(local[0], abs=1e-4)
    finally:
        conn.close()
