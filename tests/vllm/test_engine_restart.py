"""A vLLM engine whose process dies is restarted: the call that hit it fails with a clear TwinkleError, the next
call is served by a fresh engine with the adapters re-registered (same outputs as before), and if base weights had
been loaded into the dead engine the sampler refuses to sample until they are loaded again (slow: its own engine)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from twinkle_core.errors import TwinkleError

pytest.importorskip('vllm')


def kill_engine(sampler) -> None:
    pid = sampler._handle.engine_core_pid()
    assert pid is not None, 'the engine core should run in its own process'
    os.kill(pid, signal.SIGKILL)


def call_until_detected(sampler, prompt):
    """The client notices a dead engine on its next call; that call raises."""
    with pytest.raises(TwinkleError, match='vLLM engine died during sample'):
        sampler.sample([prompt], max_tokens=4, temperature=0.0)


@pytest.mark.slow
def test_a_dead_engine_is_restarted_with_its_adapters_and_refuses_lost_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from tests.contract.test_sampler_contract import peft_adapter
    from twinkle_vllm.sampler import vLLMSampler

    sampler = vLLMSampler(tiny_model_dir, engine_args={'max_model_len': 256, 'max_lora_rank': 16}, multiprocess=True)
    try:
        _, config, tensors = peft_adapter(tiny_model_dir, seed=7)
        sampler.add_adapter('tenant', config, tensors)
        prompt = [5, 6, 7, 8]
        before = [
            sampler.sample([prompt], max_tokens=4, temperature=0.0, adapter_name=a)[0].sequences[0].tokens
            for a in ('tenant', None)
        ]

        kill_engine(sampler)
        call_until_detected(sampler, prompt)
        after = [
            sampler.sample([prompt], max_tokens=4, temperature=0.0, adapter_name=a)[0].sequences[0].tokens
            for a in ('tenant', None)
        ]
        assert after == before and sampler._handle.restarts == 1

        state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
        sampler.load_weights(state)  # base weights now live only in the engine
        kill_engine(sampler)
        call_until_detected(sampler, prompt)
        with pytest.raises(TwinkleError, match='lost the base weights'):
            sampler.sample([prompt], max_tokens=4)
        sampler.begin_weight_update()
        sampler.load_weights(state)
        sampler.end_weight_update()
        assert sampler.sample([prompt], max_tokens=4, temperature=0.0)[0].sequences[0].tokens == before[1]
    finally:
        sampler.shutdown()
