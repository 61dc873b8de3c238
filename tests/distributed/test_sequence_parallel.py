"""Ulysses sequence parallelism (``cp_size``/``sp_size``) on TransformersModel under torchrun (gloo): every rank
takes a slice of each row, attention swaps it for a slice of the heads, and training equals one process on the
same batches -- padded and padding-free, alone, with DDP, with FSDP2 and with activation checkpointing.

"Equal" is 1e-5 on every step's loss and gradient norm and on the final per-token log-probs: the split changes
only float32 summation order (the runs measured here differ by <= 1.5e-6). A missed gradient average, a wrong
slice or a mask that lets a token see the future moves them by 1e-2 or more.
"""

from __future__ import annotations

import pytest
from spmd_runner import run_worker

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceMesh
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.sequence_parallel import ATTN_IMPLEMENTATION

TOL = 1e-5


def assert_same_training(split: dict, single: dict) -> None:
    assert split['attn_implementation'] == ATTN_IMPLEMENTATION  # the split run really split its sequences
    assert split['losses'] == pytest.approx(single['losses'], abs=TOL)
    assert split['grad_norms'] == pytest.approx(single['grad_norms'], abs=TOL)
    for got, want in zip(split['eval_logprobs'], single['eval_logprobs'], strict=True):
        assert got == pytest.approx(want, abs=TOL)


@pytest.fixture(scope='module')
def single(tiny_model_dir, tmp_path_factory) -> dict:
    return run_worker(tiny_model_dir, tmp_path_factory.mktemp('single'))


@pytest.fixture(scope='module')
def single_packed(tiny_model_dir, tmp_path_factory) -> dict:
    return run_worker(tiny_model_dir, tmp_path_factory.mktemp('single_packed'), extra=('--padding-free',))


def test_two_ranks_split_padded_rows_and_train_like_one_process(tiny_model_dir, tmp_path, single) -> None:
    split = run_worker(tiny_model_dir, tmp_path, nproc=2, extra=('--cp', '2'))
    assert_same_training(split, single)
    assert len(set(split['losses'])) > 1  # a real curve, not one repeated number
    # called directly, the split model refuses rather than attend within each rank's slice
    assert split['direct_call_error'].startswith('MeshError: this model splits sequences over its cp ranks')


def test_two_ranks_split_padding_free_rows_and_train_like_one_process(tiny_model_dir, tmp_path, single_packed) -> None:
    split = run_worker(tiny_model_dir, tmp_path, nproc=2, extra=('--cp', '2', '--padding-free'))
    assert_same_training(split, single_packed)


@pytest.mark.slow
def test_hidden_state_log_probs_and_checkpointing_under_the_split(tiny_model_dir, tmp_path, single) -> None:
    """The chunked log-prob path (from hidden states) and checkpointed layers (which rerun the all-to-alls in
    the backward) give the same training."""
    split = run_worker(
        tiny_model_dir, tmp_path, nproc=2, extra=('--cp', '2', '--logps-from-hidden', '--gradient-checkpointing')
    )
    assert_same_training(split, single)


@pytest.mark.slow
@pytest.mark.parametrize(
    'extra,packed',
    [(('--cp', '2', '--fsdp', '2'), False), (('--cp', '2', '--dp', '2', '--padding-free'), True)],
    ids=['fsdp2-x-sp2', 'ddp2-x-sp2-packed'],
)
def test_sequence_parallelism_composes_with_data_parallelism(
    tiny_model_dir, tmp_path, single, single_packed, extra, packed
) -> None:
    split = run_worker(tiny_model_dir, tmp_path, nproc=4, extra=extra)
    assert split['world_size'] == 4
    assert_same_training(split, single_packed if packed else single)


def test_heads_that_the_split_does_not_divide_are_refused(tiny_model_dir) -> None:
    """The tiny model has 4 query heads and 2 key/value heads: 4 ranks cannot each take whole key/value heads."""
    mesh = DeviceMesh.from_sizes(sp_size=4, device_type='cpu')
    with pytest.raises(MeshError, match=r'num_key_value_heads=2 is not divisible by 4; pick a cp_size'):
        TransformersModel(tiny_model_dir, device_mesh=mesh)


def test_sp_size_names_the_cp_dimension() -> None:
    assert DeviceMesh.from_sizes(sp_size=2, dp_size=2).sizes['cp'] == 2
    assert DeviceMesh.from_sizes(sp_size=2, cp_size=2).world_size == 2
    with pytest.raises(MeshError, match='name the same dimension'):
        DeviceMesh.from_sizes(sp_size=2, cp_size=4)


def test_sequence_parallelism_is_refused_with_tensor_parallelism(tiny_model_dir) -> None:
    mesh = DeviceMesh.from_sizes(cp_size=2, tp_size=2, device_type='cpu')
    with pytest.raises(MeshError, match='cp_size=2 with tp_size=2: sequence parallelism composes with dp and fsdp'):
        TransformersModel(tiny_model_dir, device_mesh=mesh)
