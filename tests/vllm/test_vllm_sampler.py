"""What is specific to vLLMSampler (the shared contract is in tests/contract): engine arguments are validated
before vLLM starts, LoRA limits and partial layers are refused before they reach the engine (where an error would
kill it), capabilities are declared, and the engine keeps serving after every refusal."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError

pytest.importorskip('vllm')


@pytest.mark.parametrize(
    'engine_args, message',
    [
        ({'max_modl_len': 64}, "Unknown vLLM engine argument 'max_modl_len'; did you mean max_model_len"),
        ({'model': '/elsewhere'}, 'pass the model as model_id='),
        ({'worker_extension_cls': 'x.Y'}, 'needs twinkle_vllm.worker_extension'),
    ],
)
def test_bad_engine_args_are_refused_before_vllm_starts(tiny_model_dir, engine_args, message):
    from twinkle_vllm.sampler import vLLMSampler

    with pytest.raises(InvalidInputError, match=message):
        vLLMSampler(tiny_model_dir, engine_args=engine_args)


def test_a_missing_model_directory_is_named(tmp_path):
    from twinkle_vllm.sampler import vLLMSampler

    with pytest.raises(InvalidInputError, match='does not exist'):
        vLLMSampler(tmp_path / 'nope')


@pytest.fixture
def process_group(monkeypatch):
    """A one-rank gloo process group in this process, as a Ray group's rank or a torchrun rank has."""
    import torch.distributed as dist

    from twinkle_core.utils.net import free_port

    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', str(free_port()))
    dist.init_process_group('gloo', rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_an_engine_in_a_process_with_a_process_group_gets_its_own_process(tiny_model_dir, process_group):
    """vLLM's engine inside a process that has a torch.distributed group takes that group over and destroys it at
    shutdown (seen with vLLM 0.32): refused when asked for, never chosen by default."""
    from twinkle_vllm.llm_handle import engine_in_own_process
    from twinkle_vllm.sampler import vLLMSampler

    with pytest.raises(InvalidInputError, match=r'already has a torch.distributed process group \(1 rank'):
        vLLMSampler(tiny_model_dir, multiprocess=False)
    assert process_group.is_initialized()
    assert engine_in_own_process(None) and engine_in_own_process(True)


def test_the_default_follows_vllms_own_switch(monkeypatch):
    from twinkle_vllm.llm_handle import engine_in_own_process

    monkeypatch.setenv('VLLM_ENABLE_V1_MULTIPROCESSING', '0')
    assert not engine_in_own_process(None) and engine_in_own_process(True)
    monkeypatch.delenv('VLLM_ENABLE_V1_MULTIPROCESSING')
    assert engine_in_own_process(None) and not engine_in_own_process(False)


def test_capabilities_are_declared(vllm_sampler):
    caps = vllm_sampler.capabilities
    assert caps.per_row_adapters and caps.prompt_logprobs and not caps.adapter_from_tensors
    assert not caps.weights_in_process and caps.max_adapters == 64


def test_a_rank_above_max_lora_rank_is_refused(vllm_sampler, tiny_model_dir):
    from tests.contract.test_sampler_contract import peft_adapter

    _, config, tensors = peft_adapter(tiny_model_dir, seed=5, rank=32)
    with pytest.raises(InvalidInputError, match="rank 32, above this engine's max_lora_rank=16"):
        vllm_sampler.add_adapter('big', config, tensors)
    assert 'big' not in vllm_sampler.list_adapters()
    assert vllm_sampler.sample([[5, 6]], max_tokens=2)[0].sequences


def test_non_lora_tensors_are_refused_as_an_adapter(vllm_sampler):
    with pytest.raises(InvalidInputError, match='are not LoRA tensors'):
        vllm_sampler.add_adapter(
            'x', {'r': 4, 'target_modules': ['q_proj']}, {'model.embed_tokens.weight': torch.zeros(2, 2)}
        )


def test_part_of_a_layer_outside_an_update_is_refused_and_changes_nothing(vllm_sampler, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    before = vllm_sampler.sample([[5, 6, 7]], max_tokens=4, temperature=0.0, prompt_logprobs=True)[0]
    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    q = {'model.layers.0.self_attn.q_proj.weight': state['model.layers.0.self_attn.q_proj.weight'] * 0}
    with pytest.raises(InvalidInputError, match="only part of 1 layer.*'model.layers.0'"):
        vllm_sampler.load_weights(q)
    after = vllm_sampler.sample([[5, 6, 7]], max_tokens=4, temperature=0.0, prompt_logprobs=True)[0]
    assert after.sequences[0].logprobs == before.sequences[0].logprobs
    assert after.prompt_logprobs == before.prompt_logprobs


def test_import_twinkle_core_and_the_plugin_do_not_import_vllm():
    import subprocess
    import sys

    code = (
        'import sys, twinkle_core, twinkle_vllm; from twinkle_core.registry import resolve; '
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, '-c', code], check=True)


def test_greedy_outputs_equal_torch_samplers_on_the_same_weights(vllm_sampler, tiny_model_dir):
    """vLLM and TorchSampler side by side: greedy tokens are identical and their logprobs agree (1e-4), for the
    base model and for the same adapter, several adapters mixed in one call."""
    from tests.contract.test_sampler_contract import PROMPTS, peft_adapter
    from twinkle_core.registry import resolve

    torch_sampler = resolve('sampler', 'TorchSampler', model_id=str(tiny_model_dir), device='cpu')
    _, config, tensors = peft_adapter(tiny_model_dir, seed=7)
    for s in (vllm_sampler, torch_sampler):
        s.add_adapter('shared', config, tensors)
    try:
        names = [None, 'shared', 'shared']
        got = vllm_sampler.sample(PROMPTS, max_tokens=10, temperature=0.0, adapter_name=names)
        want = torch_sampler.sample(PROMPTS, max_tokens=10, temperature=0.0, adapter_name=names)
        for g, w in zip(got, want):
            assert g.sequences[0].tokens == w.sequences[0].tokens
            assert g.sequences[0].logprobs == pytest.approx(w.sequences[0].logprobs, abs=1e-4)
        base = vllm_sampler.sample(PROMPTS[1:], max_tokens=10, temperature=0.0)
        assert any(b.sequences[0].tokens != g.sequences[0].tokens for b, g in zip(base, got[1:]))  # adapter used
    finally:
        vllm_sampler.remove_adapter('shared')


def test_top_logprobs_above_the_engines_limit_are_refused_before_vllm(vllm_sampler):
    limit = vllm_sampler._handle.llm_engine.vllm_config.model_config.max_logprobs
    with pytest.raises(InvalidInputError, match=f"top_logprobs={limit + 1} is above the engine's max_logprobs"):
        vllm_sampler.sample([[5, 6]], max_tokens=2, top_logprobs=limit + 1)
    top = vllm_sampler.sample([[5, 6]], max_tokens=2, top_logprobs=limit)[0].sequences[0].top_logprobs
    assert [len(step) for step in top] == [limit, limit]


def test_image_prompts_are_refused_before_vllm(vllm_sampler, tiny_vl_model_dir):
    """vLLM's multimodal input path is not wired (it needs torchvision): an image prompt is refused clearly
    instead of being sampled without its images."""
    from twinkle_core.fixtures.images import colour_trajectories
    from twinkle_core.template.vision import VisionTemplate

    row = VisionTemplate(str(tiny_vl_model_dir)).encode(
        colour_trajectories(1, with_answer=False)[0], add_generation_prompt=True
    )
    with pytest.raises(InvalidInputError, match='multimodal prompts need'):
        vllm_sampler.sample([row], max_tokens=2)
    assert vllm_sampler.sample([[5, 6]], max_tokens=2)[0].sequences
