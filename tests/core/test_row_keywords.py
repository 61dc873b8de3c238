"""`forward_backward`'s per-row keywords folded into rows (`twinkle_core.train.row_keywords`): ``old_logps`` go to
the labelled positions of multi-turn rows (sampled turns separated by inserted tokens), left-padded otherwise."""

from __future__ import annotations

import pytest

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.row_keywords import with_row_keywords

X = -100


def test_old_logps_of_every_labelled_token_go_to_those_positions():
    row = {'input_ids': [1, 2, 3, 4, 5, 6, 7], 'labels': [X, 2, 3, X, X, 6, X]}
    (out,) = with_row_keywords([row], old_logps=[[-0.2, -0.3, -0.6]])
    assert out['old_logps'] == [0.0, -0.2, -0.3, 0.0, 0.0, -0.6, 0.0]


def test_a_completions_log_probs_are_left_padded_as_before():
    completion = {'input_ids': [1, 2, 3, 4], 'labels': [X, X, 3, 4]}
    (out,) = with_row_keywords([completion], old_logps=[[-0.3, -0.4]])
    assert out['old_logps'] == [0.0, 0.0, -0.3, -0.4]
    partly = {'input_ids': [1, 2, 3, 4], 'labels': [X, X, 3, X]}  # not one value per label: the row's last tokens
    (out,) = with_row_keywords([partly], old_logps=[[-0.3, -0.4]])
    assert out['old_logps'] == [0.0, 0.0, -0.3, -0.4]
    (out,) = with_row_keywords([{'input_ids': [1, 2, 3]}], old_logps=[[-0.5]])  # no labels
    assert out['old_logps'] == [0.0, 0.0, -0.5]


def test_too_many_old_logps_is_an_error():
    with pytest.raises(InvalidInputError, match=r'old_logps\[0\] has 3 values for a row of 2 tokens'):
        with_row_keywords([{'input_ids': [1, 2], 'labels': [X, 2]}], old_logps=[[-1.0, -1.0, -1.0]])
