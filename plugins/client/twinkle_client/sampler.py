"""The Twinkle documents' module path: ``from twinkle_client.sampler import vLLMSampler`` (a `RemoteSampler`:
the sampler a twinkle server runs, vLLM or TorchSampler)."""

from twinkle_client.remote import RemoteSampler, TorchSampler, vLLMSampler

__all__ = ['RemoteSampler', 'TorchSampler', 'vLLMSampler']
