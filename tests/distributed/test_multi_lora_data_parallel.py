"""MultiLoraTransformersModel on several data ranks (torchrun, gloo on CPU): three tenants with different LoRA ranks,
targets and losses in mixed passes train exactly as in one process over the same global rows -- per-tenant losses,
gradient norms, metrics and adapter weights -- with the base replicated (dp=2), sharded (FSDP2, fsdp=2: each rank
holds ~half of it) and both (HSDP, dp=2 x fsdp=2: 4 ranks, where some ranks hold no rows of a tenant in a call); a
tenant whose rows are bad on one rank only is rejected alone on every rank; every rank holds the same adapters; and
the checkpoint written at N ranks is the one-process checkpoint (it loads in one process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from spmd_runner import run_worker

from twinkle_core.errors import MeshError
from twinkle_core.fixtures import random_token_rows
from twinkle_core.mesh import DeviceMesh

WORKER = Path(__file__).parent / 'multi_lora_worker.py'
TOL = 1e-5  # float32: the ranks' partial gradients summed in another order than one process's
LAYOUTS = {'dp2': ('--dp', '2'), 'fsdp2': ('--fsdp', '2'), 'dp2xfsdp2': ('--dp', '2', '--fsdp', '2')}


@pytest.fixture(scope='module')
def one_process(tiny_model_dir, tmp_path_factory) -> dict:
    return run_worker(tiny_model_dir, tmp_path_factory.mktemp('one'), worker=WORKER)


@pytest.fixture(scope='module')
def two_ranks(tiny_model_dir, tmp_path_factory) -> dict:
    return run_worker(tiny_model_dir, tmp_path_factory.mktemp('two'), nproc=2, extra=LAYOUTS['dp2'], worker=WORKER)


@pytest.mark.parametrize('layout', list(LAYOUTS))
def test_data_ranks_train_three_tenants_like_one_process(tiny_model_dir, tmp_path, one_process, two_ranks, layout):
    extra = LAYOUTS[layout]
    ranks = 4 if layout == 'dp2xfsdp2' else 2
    run = (
        two_ranks if layout == 'dp2' else run_worker(tiny_model_dir, tmp_path, nproc=ranks, extra=extra, worker=WORKER)
    )
    assert run['world_size'] == ranks
    for name, losses in one_process['losses'].items():
        got = run['losses'][name]
        assert [isinstance(x, str) for x in got] == [isinstance(x, str) for x in losses]
        assert [x for x in got if isinstance(x, str)] == [x for x in losses if isinstance(x, str)]
        assert [x for x in got if not isinstance(x, str)] == pytest.approx(
            [x for x in losses if not isinstance(x, str)], abs=TOL
        )
        assert run['grad_norms'][name] == pytest.approx(one_process['grad_norms'][name], abs=TOL)
        assert run['eval_loss'][name] == pytest.approx(one_process['eval_loss'][name], abs=TOL)
        assert run['metrics'][name]['loss'] == pytest.approx(one_process['metrics'][name]['loss'], abs=TOL)
        assert run['metrics'][name]['num_tokens'] == one_process['metrics'][name]['num_tokens']
        assert_same_weights(run['checkpoints'][name], one_process['checkpoints'][name])
    assert run['optimizer_steps'] == one_process['optimizer_steps'] == {'a': 3, 'b': 1, 'c': 3}
    assert all(digest == run['digests'][0] for digest in run['digests'])  # every rank holds the same adapters
    # step 2: 'c' has a NaN advantage in its last row, held by the last rank only -- rejected on every rank
    assert "'advantage' of row" in run['c_error']
    assert f'data rank {ranks - 1}; nothing was applied on any rank' in run['c_error']
    sharded = '--fsdp' in extra
    base = run['base_elements_per_rank'] / one_process['base_elements_per_rank']
    assert base < 0.6 if sharded else base == 1.0  # FSDP2: each rank holds its shards of the frozen base


def test_a_tenant_with_bad_rows_on_one_rank_is_rejected_alone(one_process, two_ranks) -> None:
    """Step 2 gives 'c' a NaN advantage in its last row, which only the last data rank holds: rank 0 (whose rows
    were fine) reports the agreed rejection; 'c' took no step from it (grad norm 0, as in one process) while 'a'
    and 'b' trained."""
    run = two_ranks
    assert run['losses']['c'][2] == one_process['losses']['c'][2] == 'rejected: loss'
    assert run['grad_norms']['c'][2] == one_process['grad_norms']['c'][2] == 0.0
    assert isinstance(run['losses']['a'][2], float) and run['grad_norms']['a'][2] > 0


def test_a_checkpoint_of_two_ranks_loads_in_one_process(tiny_model_dir, two_ranks) -> None:
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    run = two_ranks
    model = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    model.load(run['checkpoints']['a'], adapter_name='a')
    assert model.forward_only(inputs=random_token_rows(4, seed=99), adapter_name='a')['loss'] == pytest.approx(
        run['eval_loss']['a'], abs=TOL
    )


def test_mesh_dimensions_other_than_dp_and_fsdp_are_refused_before_loading(tiny_model_dir) -> None:
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    with pytest.raises(MeshError, match=r'tp_size=2 .* MultiLoraTransformersModel .*implements: dp_size, fsdp_size'):
        MultiLoraTransformersModel(tiny_model_dir, device_mesh=DeviceMesh.from_sizes(tp_size=2, device_type='cpu'))


def assert_same_weights(path: str, reference: str) -> None:
    """The adapter tensors of two checkpoints: mean absolute difference <= 1e-7, every element within 1e-3 (a tenth of
    the learning rate: Adam turns float32 summation-order noise in a near-zero gradient element into a step of up to
    a fraction of the learning rate; a wrong combination of the ranks' gradients moves the mean by ~1e-3)."""
    got = load_file(Path(path) / 'adapter_model.safetensors')
    want = load_file(Path(reference) / 'adapter_model.safetensors')
    assert got.keys() == want.keys()
    diffs = torch.cat([(got[key] - want[key]).abs().flatten() for key in want])
    assert float(diffs.mean()) <= 1e-7 and float(diffs.max()) <= 1e-3
