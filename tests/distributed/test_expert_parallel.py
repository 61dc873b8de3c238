"""MoE expert parallelism (``ep_size``) on TransformersModel under torchrun (gloo), on the tiny Qwen3-MoE fixture:
each rank holds a slice of every layer's experts, tokens travel to them by all-to-all, and training equals one
process on the same batches -- full-parameter (expert gradients averaged by the exchange) and LoRA (frozen
experts), with each expert held once (dp2 x ep2) and twice (dp4 x ep2); checkpoints hold whole experts and
resume at another world size.

"Equal" is 1e-5 on every step's loss and gradient norm and on the final per-token log-probs (measured: <= 2.4e-6);
a token sent to the wrong expert, a missing gradient sum or a wrong average moves them by 1e-3 or more. Saved
weights are compared to 1e-4: AdamW moves every element by up to lr (1e-3) per step whatever its gradient's size,
so float noise in a near-zero gradient shows up to ~1e-5 (measured 1.5e-5); an expert shard that did not train
or was saved from the wrong rank is 2e-3 away after two steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from spmd_runner import run_worker

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceMesh
from twinkle_transformers.expert_parallel import EXPERTS_IMPLEMENTATION
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.sharded_checkpoint import export_checkpoint

TOL = 1e-5
WEIGHT_TOL = 1e-4
FULL = ('--full',)
K = 2  # steps before a checkpoint, and after it


def assert_same_training(split: dict, single: dict) -> None:
    assert split['experts_implementation'] == EXPERTS_IMPLEMENTATION  # the experts really were sharded
    assert split['losses'] == pytest.approx(single['losses'], abs=TOL)
    assert split['grad_norms'] == pytest.approx(single['grad_norms'], abs=TOL)
    for got, want in zip(split['eval_logprobs'], single['eval_logprobs'], strict=True):
        assert got == pytest.approx(want, abs=TOL)


def saved_weights(checkpoint: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(checkpoint).state_dict())


@pytest.fixture(scope='module')
def single_full(tiny_moe_model_dir, tmp_path_factory) -> dict:
    return run_worker(tiny_moe_model_dir, tmp_path_factory.mktemp('single_full'), extra=FULL)


def test_two_expert_ranks_train_like_one_process_and_save_whole_experts(
    tiny_moe_model_dir, tmp_path, single_full
) -> None:
    split = run_worker(tiny_moe_model_dir, tmp_path, nproc=2, extra=(*FULL, '--dp', '2', '--ep', '2'))
    assert_same_training(split, single_full)
    assert len(set(split['losses'])) > 1
    # the gathered checkpoint holds every expert, as one process trained them, and loads in plain transformers
    got, want = saved_weights(split['checkpoint']), saved_weights(single_full['checkpoint'])
    assert got.keys() == want.keys() and any('experts' in name for name in got)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=WEIGHT_TOL, rtol=0, msg=name)


def test_lora_over_sharded_frozen_experts_trains_like_one_process(tiny_moe_model_dir, tmp_path_factory) -> None:
    single = run_worker(tiny_moe_model_dir, tmp_path_factory.mktemp('single_lora'))
    split = run_worker(
        tiny_moe_model_dir, tmp_path_factory.mktemp('ep_lora'), nproc=2, extra=('--dp', '2', '--ep', '2')
    )
    assert_same_training(split, single)
    # peft adapts the experts' 3-D weights too ('all-linear' on a MoE model): their factors train and save alike
    got, want = (load_file(Path(r['checkpoint']) / 'adapter_model.safetensors') for r in (split, single))
    assert got.keys() == want.keys() and any('experts' in name for name in got)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=WEIGHT_TOL, rtol=0, msg=name)


@pytest.fixture(scope='module')
def one_sided_moe_model_dir(tiny_moe_model_dir, tmp_path_factory) -> Path:
    """The MoE fixture with routers that never pick experts 4-7 (the second rank's under ep_size=2): rows
    ``[v, -v, u, -u, 0, 0, 0, 0]`` give two of experts 0-3 a positive logit for any token, the others 0."""
    import shutil

    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp('one_sided_moe')
    model = AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith('mlp.gate.weight'):
                v, u = torch.randn(2, weight.shape[1], generator=generator) * 0.5
                weight.copy_(torch.stack([v, -v, u, -u, *torch.zeros(4, weight.shape[1])]))
    model.save_pretrained(out)
    for name in ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja'):
        if (tiny_moe_model_dir / name).exists():
            shutil.copy(tiny_moe_model_dir / name, out / name)
    return out


@pytest.mark.slow
@pytest.mark.parametrize('extra', [FULL, ()], ids=['full', 'lora'])
def test_a_rank_whose_experts_get_no_token_still_trains_like_one_process(
    one_sided_moe_model_dir, tmp_path_factory, extra
) -> None:
    """Every token goes to the first rank's experts: the second rank runs none, sends everything and receives
    nothing, and its experts (and their LoRA factors, which DDP expects a gradient for) still join the step."""
    single = run_worker(one_sided_moe_model_dir, tmp_path_factory.mktemp('single_one_sided'), extra=extra)
    split = run_worker(
        one_sided_moe_model_dir,
        tmp_path_factory.mktemp('ep_one_sided'),
        nproc=2,
        extra=(*extra, '--dp', '2', '--ep', '2'),
    )
    assert_same_training(split, single)


@pytest.mark.slow
def test_checkpointed_layers_packed_rows_and_hidden_state_log_probs_under_expert_parallelism(
    tiny_moe_model_dir, tmp_path_factory
) -> None:
    """Checkpointed layers rerun the exchange in the backward; padding-free rows and the chunked log-prob path
    change nothing either."""
    packed = ('--padding-free',)
    single = run_worker(tiny_moe_model_dir, tmp_path_factory.mktemp('single_packed'), extra=(*FULL, *packed))
    extra = (*FULL, *packed, '--dp', '2', '--ep', '2', '--gradient-checkpointing', '--logps-from-hidden')
    split = run_worker(tiny_moe_model_dir, tmp_path_factory.mktemp('ep_ckpt'), nproc=2, extra=extra)
    assert_same_training(split, single)
    assert split['hidden_state_logps'] > 0


@pytest.mark.slow
def test_experts_held_twice_average_over_their_replicas_and_resume_at_other_world_sizes(
    tiny_moe_model_dir, tmp_path_factory, single_full
) -> None:
    """dp4 x ep2: every expert lives on two ranks (its gradients are summed over both). A sharded (DCP) checkpoint
    after K steps exports to the model one process trains and resumes on one process and on dp2 x ep2 with the
    same losses as the straight run."""
    root = tmp_path_factory.mktemp('ep_dp4')
    mesh = ('--dp', '4', '--ep', '2')
    straight = run_worker(tiny_moe_model_dir, root / 'straight', nproc=4, extra=(*FULL, *mesh))
    assert_same_training(straight, single_full)
    half = run_worker(
        tiny_moe_model_dir,
        root / 'half',
        nproc=4,
        extra=(*FULL, *mesh, '--steps', str(K), '--save-optimizer', '--save-format', 'sharded'),
    )
    # exported (tensor by tensor from the shards) it is the model one process has after K steps
    single_half = run_worker(tiny_moe_model_dir, root / 'single_half', extra=(*FULL, '--steps', str(K)))
    got = saved_weights(export_checkpoint(half['checkpoint'], root / 'exported'))
    want = saved_weights(single_half['checkpoint'])
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=WEIGHT_TOL, rtol=0, msg=name)
    resume = ('--steps', str(K), '--skip-steps', str(K), '--resume', half['checkpoint'])
    for nproc, layout in ((1, ()), (2, ('--dp', '2', '--ep', '2'))):
        resumed = run_worker(tiny_moe_model_dir, root / f'resumed{nproc}', nproc=nproc, extra=(*FULL, *layout, *resume))
        assert resumed['optimizer_steps'] == 2 * K
        assert resumed['losses'] == pytest.approx(straight['losses'][K:], abs=TOL), nproc


# ---- refused where it cannot work (at construction: no process group needed) ----------------------------------
def test_a_dense_model_refuses_expert_parallelism(tiny_model_dir) -> None:
    mesh = DeviceMesh.from_sizes(dp_size=2, ep_size=2, device_type='cpu')
    with pytest.raises(MeshError, match='ep_size=2: Qwen3ForCausalLM has no mixture-of-experts layers'):
        TransformersModel(tiny_model_dir, device_mesh=mesh)


def test_experts_that_ep_size_does_not_divide_are_refused(tiny_moe_model_dir) -> None:
    mesh = DeviceMesh.from_sizes(dp_size=3, ep_size=3, device_type='cpu')
    with pytest.raises(MeshError, match='ep_size=3 does not divide num_experts=8'):
        TransformersModel(tiny_moe_model_dir, device_mesh=mesh)


@pytest.mark.parametrize('sizes', [dict(fsdp_size=2), dict(dp_size=2, cp_size=2)], ids=['fsdp', 'cp'])
def test_expert_parallelism_with_other_splits_is_refused(tiny_moe_model_dir, sizes) -> None:
    mesh = DeviceMesh.from_sizes(ep_size=2, device_type='cpu', **sizes)
    with pytest.raises(MeshError, match='ep_size=2 with .* expert parallelism composes with dp only'):
        TransformersModel(tiny_moe_model_dir, device_mesh=mesh)


@pytest.mark.slow
def test_a_lora_checkpoint_of_one_process_resumes_under_expert_parallelism(
    tiny_moe_model_dir, tmp_path_factory
) -> None:
    """The adapter (expert factors included) and its optimizer state load into the sharded model and train on."""
    root = tmp_path_factory.mktemp('ep_lora_resume')
    straight = run_worker(tiny_moe_model_dir, root / 'straight', extra=('--steps', str(2 * K)))
    half = run_worker(tiny_moe_model_dir, root / 'half', extra=('--steps', str(K), '--save-optimizer'))
    resume = ('--steps', str(K), '--skip-steps', str(K), '--resume', half['checkpoint'])
    resumed = run_worker(tiny_moe_model_dir, root / 'resumed', nproc=2, extra=('--dp', '2', '--ep', '2', *resume))
    assert resumed['optimizer_steps'] == 2 * K
    assert resumed['losses'] == pytest.approx(straight['losses'][K:], abs=TOL)
