"""TorchSampler: native batched KV-cache sampling on Hugging Face models (kind `sampler`)."""

from twinkle_transformers.sampler.torch_sampler import TorchSampler

__all__ = ['TorchSampler']
