"""Runs inside every vLLM worker process (``worker_extension_cls``): the receiving end of a weight update lives
where the weights live, so it works whether vLLM's engine core runs in this process or in its own.

Tensors travel as safetensors bytes (what vLLM's RPC can carry without pickling); one call per bucket, so the
worker holds one bucket at a time.
"""
from __future__ import annotations


class TwinkleWorkerExtension:
    """Mixed into vLLM's worker class; methods are called through ``LLM.collective_rpc(name, args=...)``."""

    def twinkle_load_weights(self, blob: bytes) -> int:
        """Copy the base weights in `blob` (Hugging Face names) into the model in place; returns how many."""
        from safetensors.torch import load
        weights = load(blob)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))  # type: ignore[attr-defined]
        return len(weights)
