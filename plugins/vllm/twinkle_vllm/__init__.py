"""vLLM sampler plugin (kind `sampler`: `vLLMSampler`). Importing this package does not import vllm; building a
sampler does."""

from typing import Any

__all__ = ['vLLMSampler']


def __getattr__(name: str) -> Any:
    if name == 'vLLMSampler':
        from twinkle_vllm.sampler import vLLMSampler

        return vLLMSampler
    raise AttributeError(name)
