"""Megatron's process groups from a twinkle `DeviceMesh`.

The mesh orders ranks ``pp, dp, fsdp, cp, tp`` (tp innermost), which is Megatron's default ``tp-cp-ep-dp-pp``
order read from the other end, so a mesh rank and a Megatron rank are the same number. Megatron keeps its groups
in module-level state: one layout per process. A second `MegatronModel` with the same layout shares the groups;
one with another layout raises.

A single process (no launcher) gets a one-rank gloo group of its own, so the same code path runs everywhere.
"""

from __future__ import annotations

import os
from typing import Any

from twinkle_core.errors import MeshError
from twinkle_core.runtime import distributed
from twinkle_core.utils.net import free_port
from twinkle_megatron.architecture import Layout

_active: Layout | None = None
_owns_world = False  # this module started the (one-rank) default process group


#: what MegatronModel's mesh refusal (`twinkle_core.model.mesh_support`) suggests instead of fsdp and cp, the
#: mesh dimensions it does not implement
MESH_ADVICE: tuple[tuple[str, str], ...] = (
    (
        'fsdp',
        'use dp_size with the distributed optimizer (ZeRO-1, the default when dp > 1) or tensor/pipeline parallelism',
    ),
    (
        'cp',
        'context parallelism needs TransformerEngine attention, which the local (non-TE) layer spec lacks: '
        'install transformer-engine[pytorch] on a CUDA machine, or use sequence parallelism (tp_size > 1, '
        'sequence_parallel=True)',
    ),
)


def layout_of(mesh: Any, *, sequence_parallel: bool = False, virtual_pipeline: int = 1) -> Layout:
    """The Megatron layout a mesh asks for (None: one rank). The dimensions Megatron does not implement here
    (fsdp, cp) are refused before, from `MegatronModel.capabilities` (`twinkle_core.model.mesh_support`)."""
    if mesh is None:
        return Layout(sp=sequence_parallel, vpp=virtual_pipeline)
    return Layout(
        tp=mesh.size('tp'),
        pp=mesh.size('pp'),
        dp=mesh.size('dp'),
        vpp=virtual_pipeline,
        sp=sequence_parallel,
        ep=mesh.ep_size,
    )


def initialize(mesh: Any, layout: Layout, *, seed: int = 42) -> None:
    """Start torch.distributed (a one-rank gloo group without a launcher) and Megatron's model-parallel groups
    for `layout`, and seed Megatron's RNG trackers. Idempotent for the same layout."""
    global _active, _owns_world
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if _active is not None:
        if _active != layout:
            raise MeshError(
                f'This process already runs a MegatronModel split as {_active}; Megatron keeps one '
                f'layout per process, so a model split as {layout} needs its own process.'
            )
        return
    if not distributed.init_process_group(mesh):
        if layout.tp * layout.pp * layout.dp > 1:
            raise MeshError(
                f'{layout} needs {layout.tp * layout.pp * layout.dp} ranks; launch with torchrun or a '
                f'Ray group of that size.'
            )
        backend = 'nccl' if torch.cuda.is_available() else 'gloo'
        # under `torchrun --nproc_per_node 1` the rendezvous goes through torchrun's own store (a store of our own on
        # another port would wait for it forever)
        agent = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
        init = 'env://' if agent else f'tcp://127.0.0.1:{free_port()}'
        dist.init_process_group(backend=backend, init_method=init, rank=0, world_size=1)
        _owns_world = True
    world = dist.get_world_size()
    if layout.tp * layout.pp * layout.dp != world:
        raise MeshError(f'{layout} covers {layout.tp * layout.pp * layout.dp} ranks but the process group has {world}.')
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        expert_model_parallel_size=layout.ep,
    )
    # the inference tracker keeps CPU generators usable where CUDA ones do not exist (same seeds on a GPU)
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not torch.cuda.is_available())
    _active = layout


def shutdown() -> None:
    """Destroy Megatron's groups (and the one-rank default group `initialize` started, if it did): the process
    can then host another layout. Models built on the old groups are unusable afterwards."""
    global _active, _owns_world
    if _active is None:
        return
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if _owns_world:
        distributed.destroy_process_group(synchronize=False)
    _active, _owns_world = None, False


def tp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def dp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def pp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_group()


def expert_parallel_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_world_size()


def ranks() -> dict[str, int]:
    """This process's tp / pp / dp / ep coordinates."""
    from megatron.core import parallel_state as ps

    return {
        'tp': ps.get_tensor_model_parallel_rank(),
        'pp': ps.get_pipeline_model_parallel_rank(),
        'dp': ps.get_data_parallel_rank(),
        'ep': ps.get_expert_model_parallel_rank(),
    }
