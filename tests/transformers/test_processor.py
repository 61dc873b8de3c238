"""CausalLMProcessor: padded and padding-free layouts, the single label shift, per-token and per-row fields."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.processor.causal_lm import CausalLMProcessor
from twinkle_core.registry import resolve

ROWS = [
    {
        'input_ids': [10, 11, 12, 13],
        'labels': [-100, -100, 12, 13],
        'weights': [0.0, 0.0, 1.0, -2.0],
        'adapter_index': 1,
        'reward': 0.5,
        'tag': 'a',
    },
    {'input_ids': [20, 21], 'labels': [-100, 21], 'weights': [0.0, 3.0], 'adapter_index': 0, 'reward': 1.0, 'tag': 'b'},
]


def test_padded_layout_shifts_labels_and_per_token_fields_once():
    batch = CausalLMProcessor(pad_token_id=7)(ROWS)
    assert batch['input_ids'].tolist() == [[10, 11, 12, 13], [20, 21, 7, 7]]
    assert batch['attention_mask'].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch['position_ids'][0].tolist() == [0, 1, 2, 3] and batch['position_ids'][1, :2].tolist() == [0, 1]
    # labels[:, t] is the token predicted at t: the original labels shifted left by one, -100 at row ends/padding
    assert batch['labels'].tolist() == [[-100, 12, 13, -100], [21, -100, -100, -100]]
    assert batch['target_ids'].tolist() == [[11, 12, 13, -100], [21, -100, -100, -100]]
    assert batch['weights'].tolist() == [[0.0, 1.0, -2.0, 0.0], [3.0, 0.0, 0.0, 0.0]]
    assert batch['row_index'].tolist() == [[0, 0, 0, 0], [1, 1, -1, -1]]
    assert batch['adapter_index'].tolist() == [[1, 1, 1, 1], [0, 0, -1, -1]]
    assert batch['reward'].tolist() == [0.5, 1.0] and batch['tag'] == ['a', 'b']
    assert batch['row_lengths'] == [4, 2] and batch['num_tokens'] == 6 and batch['packed'] is False


def test_packed_layout_restarts_positions_and_never_shifts_across_rows():
    batch = resolve('processor', 'CausalLMProcessor', padding_free=True)(ROWS)
    assert batch['input_ids'].tolist() == [[10, 11, 12, 13, 20, 21]]
    assert batch['attention_mask'] is None
    assert batch['position_ids'].tolist() == [[0, 1, 2, 3, 0, 1]]
    assert batch['labels'].tolist() == [[-100, 12, 13, -100, 21, -100]]  # row 0's end does not predict row 1
    assert batch['weights'].tolist() == [[0.0, 1.0, -2.0, 0.0, 3.0, 0.0]]
    assert batch['row_index'].tolist() == [[0, 0, 0, 0, 1, 1]]
    assert batch['adapter_index'].tolist() == [[1, 1, 1, 1, 0, 0]]
    assert batch['cu_seqlens'].tolist() == [0, 4, 6] and batch['max_seqlen'] == 4


def test_pad_to_multiple_of_and_rows_without_labels():
    rows = [{'input_ids': [1, 2, 3]}]
    padded = CausalLMProcessor(pad_to_multiple_of=4)(rows)
    assert padded['input_ids'].shape == (1, 4) and (padded['labels'] == -100).all()
    assert padded['target_ids'].tolist() == [[2, 3, -100, -100]]
    packed = CausalLMProcessor(padding_free=True, pad_to_multiple_of=8)(rows)
    assert packed['input_ids'].shape == (1, 8) and packed['row_index'].tolist() == [[0, 0, 0] + [-1] * 5]
    assert 'adapter_index' not in packed  # only broadcast when rows carry it


def test_tensor_rows_are_accepted():
    rows = [
        {
            'input_ids': torch.tensor([5, 6, 7]),
            'labels': torch.tensor([-100, 6, 7]),
            'advantages': torch.tensor([0.0, 1.0, 1.0]),
        }
    ]
    batch = CausalLMProcessor()(rows)
    assert batch['labels'].tolist() == [[6, 7, -100]] and batch['advantages'].tolist() == [[1.0, 1.0, 0.0]]


def test_inconsistent_per_token_field_names_the_row():
    rows = [{'input_ids': [1, 2, 3], 'weights': [1.0, 1.0, 1.0]}, {'input_ids': [1, 2], 'weights': [1.0]}]
    with pytest.raises(InvalidInputError, match=r"row 1.*'weights'.*1 values.*2 tokens"):
        CausalLMProcessor()(rows)


def test_padded_rows_are_rejected():
    with pytest.raises(InvalidInputError, match='row 0 has padding'):
        CausalLMProcessor()([{'input_ids': [1, 2, 0], 'attention_mask': [1, 1, 0]}])
