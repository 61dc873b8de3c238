"""The Sampler interface: prompts -> sampled continuations with per-token logprobs."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from twinkle_core.dispatch import remote_method
from twinkle_core.runtime.context import HostedComponentMeta


class Sampler(ABC, metaclass=HostedComponentMeta):
    @remote_method('slice_dp', 'concat', mutates=False)
    @abstractmethod
    def sample(self, inputs: Any, sampling_params: Any = None, *, adapter_name: str | list[str] | None = None,
               **kwargs: Any) -> list[Any]:
        """`inputs`: prompts (InputFeature dicts or Trajectories). Returns one `SampleResponse` per prompt."""

    @remote_method('all', 'first')
    @abstractmethod
    def set_template(self, template: Any, **kwargs: Any) -> None:
        """Template used to encode Trajectory prompts and decode completions."""

    @remote_method('all', 'none')
    @abstractmethod
    def load_weights(self, named_tensors: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Replace base weights, or (adapter_name given) add/replace a LoRA adapter's weights."""
