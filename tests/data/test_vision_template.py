"""VisionTemplate: image layouts and sources, token expansion, labels, limits and errors; images in a Dataset."""

from __future__ import annotations

import base64

import pytest

from twinkle_core.errors import InvalidInputError
from twinkle_core.fixtures.images import QUESTION, colour_image, colour_trajectories, image_bytes
from twinkle_core.template.chat_template import ChatTemplate
from twinkle_core.template.vision import VisionTemplate
from twinkle_core.types import IGNORE_INDEX


@pytest.fixture(scope='module')
def template(tiny_vl_model_dir):
    return VisionTemplate(tiny_vl_model_dir)


def _trajectory(image, answer='red'):
    return {
        'messages': [
            {'role': 'user', 'content': [{'type': 'image', 'image': image}, {'type': 'text', 'text': QUESTION}]},
            {'role': 'assistant', 'content': answer},
        ]
    }


def test_a_112px_image_is_16_tokens_without_loss(template) -> None:
    row = template.encode(_trajectory(colour_image('red')))
    image = [i for i, t in enumerate(row['input_ids']) if t == template.image_token_id]
    assert len(image) == 16 and image == list(range(image[0], image[0] + 16))
    assert row['mm_token_type_ids'] == [int(t == template.image_token_id) for t in row['input_ids']]
    assert row['image_grid_thw'] == [[1, 8, 8]] and row['pixel_values'].shape == (64, 1536)
    assert all(row['labels'][i] == IGNORE_INDEX for i in image)
    trained = [t for t in row['labels'] if t != IGNORE_INDEX]
    assert template.decode(trained, skip_special_tokens=False) == 'red<|im_end|>'
    vision_start = template.tokenizer.convert_tokens_to_ids('<|vision_start|>')
    assert row['input_ids'][image[0] - 1] == vision_start


def test_every_image_source_and_layout_encodes_alike(template, tmp_path) -> None:
    image = colour_image('green', noise=5)
    png = image_bytes(image)
    path = tmp_path / 'green.png'
    path.write_bytes(png)
    data_url = 'data:image/png;base64,' + base64.b64encode(png).decode()
    reference = template.encode(_trajectory(image))
    for source in (png, str(path), f'file://{path}', {'bytes': png, 'path': None}, {'path': str(path)}, data_url):
        row = template.encode(_trajectory(source))
        assert row['input_ids'] == reference['input_ids'] and row['labels'] == reference['labels']
        assert (row['pixel_values'] == reference['pixel_values']).all()
    placeholders = {
        'messages': [{'role': 'user', 'content': f'<image>{QUESTION}'}, {'role': 'assistant', 'content': 'red'}],
        'images': [png],
    }
    row = template.encode(placeholders)
    assert row['input_ids'] == reference['input_ids'] and 'images' not in row


def test_image_size_sets_the_token_count_within_the_pixel_bounds(tiny_vl_model_dir, template) -> None:
    big = colour_image('blue', (640, 480))
    grid = template.process_images([big])['image_grid_thw'][0]
    assert grid[1] * grid[2] * 256 <= 224 * 224  # the fixture's max_pixels
    small = VisionTemplate(tiny_vl_model_dir, max_pixels=64 * 64)
    assert small.process_images([big])['tokens_per_image'][0] < template.process_images([big])['tokens_per_image'][0]


def test_text_only_rows_encode_like_chat_template(tiny_vl_model_dir, template) -> None:
    trajectory = {'messages': [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}]}
    assert template.encode(trajectory) == ChatTemplate(tiny_vl_model_dir).encode(trajectory)


def test_prompts_keep_their_images(template) -> None:
    row = template.encode(colour_trajectories(1)[0], add_generation_prompt=True)
    assert 'labels' not in row and sum(row['mm_token_type_ids']) == 16
    assert template.decode(row['input_ids'], skip_special_tokens=False).endswith('<|im_start|>assistant\n')


@pytest.mark.parametrize(
    'trajectory, match',
    [
        ({'messages': [{'role': 'user', 'content': '<image><image>?'}], 'images': [b'x']}, 'more <image> tags'),
        ({'messages': [{'role': 'user', 'content': '<image>?'}], 'images': [b'x', b'y']}, 'only 1 <image> tags'),
        (_trajectory(b'not an image'), 'not a decodable image'),
        (_trajectory('https://example.com/cat.png'), 'remote URL'),
        (_trajectory('/no/such/file.png'), 'cannot read image file'),
        ({'messages': [{'role': 'user', 'content': [{'type': 'audio', 'audio': b''}]}]}, "type 'audio'"),
    ],
)
def test_bad_images_are_clear_errors(template, trajectory, match) -> None:
    with pytest.raises(InvalidInputError, match=match):
        template.encode(trajectory)


def test_truncation_never_cuts_an_image(tiny_vl_model_dir) -> None:
    full = VisionTemplate(tiny_vl_model_dir).encode(_trajectory(colour_image('red')))
    n = len(full['input_ids'])
    kept = VisionTemplate(tiny_vl_model_dir, max_length=n - 2).encode(_trajectory(colour_image('red')))
    assert kept['input_ids'] == full['input_ids'][: n - 2] and len(kept['mm_token_type_ids']) == n - 2
    with pytest.raises(InvalidInputError, match='cut an image'):
        VisionTemplate(tiny_vl_model_dir, max_length=10).encode(_trajectory(colour_image('red')))


def test_dataset_encodes_images_once_and_caches(tiny_vl_model_dir) -> None:
    datasets = pytest.importorskip('datasets')
    from twinkle_core.dataset.dataset import Dataset

    data = Dataset.from_hf(datasets.Dataset.from_list(colour_trajectories(6)), name='colours')
    data.set_template('Qwen3VLTemplate', model_id=str(tiny_vl_model_dir))
    data.encode()
    assert 'images' not in data.column_names and 'messages' not in data.column_names
    assert {'pixel_values', 'image_grid_thw', 'mm_token_type_ids'} <= set(data.column_names)
    row = data[1]
    direct = VisionTemplate(tiny_vl_model_dir).encode(colour_trajectories(6)[1])
    assert row['input_ids'] == direct['input_ids']
    import numpy as np

    assert np.allclose(np.asarray(row['pixel_values'], dtype=np.float32), direct['pixel_values'])


def test_qwen3_5_template_takes_images_on_a_qwen3_5_checkpoint(tiny_qwen3_5_model_dir) -> None:
    from twinkle_core.registry import resolve

    template = resolve('template', 'Qwen3_5Template', model_id_or_tokenizer=str(tiny_qwen3_5_model_dir))
    assert template.text_only_reason is None
    row = template.encode(colour_trajectories(1)[0])
    assert sum(row['mm_token_type_ids']) == 16 and row['image_grid_thw'] == [[1, 8, 8]]
