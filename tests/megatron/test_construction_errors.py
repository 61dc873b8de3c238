"""MegatronModel refuses, at construction and before any weight or process group, what it cannot run -- with a
message that says why. (In-process: every case raises before Megatron state is created.)"""

from __future__ import annotations

import json

import pytest

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceMesh
from twinkle_megatron.architecture import UnsupportedModelError
from twinkle_megatron.model import MegatronModel


def mesh(**sizes) -> DeviceMesh:
    return DeviceMesh.from_sizes(device_type='cpu', **sizes)


@pytest.mark.parametrize(
    'sizes,kwargs,message',
    [
        (dict(tp_size=3), {}, 'tp=3 does not divide the 4 attention heads'),
        (dict(tp_size=4), {}, 'tp=4 does not divide the 2 key/value heads'),
        (dict(pp_size=8), {}, '8 pipeline stages but the model has only 4 layers'),
        (dict(pp_size=3), {}, 'do not split evenly over pp=3'),
        (dict(pp_size=2), dict(virtual_pipeline_stages=4), 'pp=2 x vpp=4 = 8 pipeline stages'),
        ({}, dict(virtual_pipeline_stages=2), 'need pp >= 2'),
        ({}, dict(sequence_parallel=True), 'sequence parallelism needs tp >= 2'),
        (dict(dp_size=2, ep_size=2), {}, 'ep=2 but the model has no experts'),
    ],
    ids=['tp-heads', 'tp-kv-heads', 'pp-layers', 'pp-uneven', 'vpp-layers', 'vpp-no-pp', 'sp-no-tp', 'ep-dense'],
)
def test_a_layout_the_model_cannot_split_fails_with_the_reason(tiny_model_dir, sizes, kwargs, message) -> None:
    with pytest.raises(MeshError, match=message):
        MegatronModel(tiny_model_dir, device_mesh=mesh(**sizes) if sizes else None, **kwargs)


def test_fsdp_and_cp_name_the_alternative(tiny_model_dir) -> None:
    with pytest.raises(MeshError, match='distributed optimizer'):
        MegatronModel(tiny_model_dir, device_mesh=mesh(fsdp_size=2))
    with pytest.raises(MeshError, match='transformer-engine'):
        MegatronModel(tiny_model_dir, device_mesh=mesh(cp_size=2))


def test_an_unsupported_architecture_fails_naming_the_supported_ones(tiny_model_dir, tmp_path) -> None:
    config = json.loads((tiny_model_dir / 'config.json').read_text())
    (tmp_path / 'config.json').write_text(
        json.dumps({**config, 'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel']})
    )
    with pytest.raises(UnsupportedModelError, match=r"qwen3, qwen2, llama, qwen3_moe.*model_type='gpt2'"):
        MegatronModel(tmp_path)
    (tmp_path / 'config.json').write_text(
        json.dumps(
            {
                **config,
                'rope_parameters': {
                    'rope_type': 'yarn',
                    'rope_theta': 1e4,
                    'factor': 4.0,
                    'original_max_position_embeddings': 512,
                },
            }
        )
    )
    with pytest.raises(UnsupportedModelError, match="RoPE scaling 'yarn'"):
        MegatronModel(tmp_path)
