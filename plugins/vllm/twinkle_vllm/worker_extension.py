"""Runs inside every vLLM worker process (``worker_extension_cls``): the receiving end of a weight update lives
where the weights live, so it works whether vLLM's engine core runs in this process or in its own.

Tensors travel as safetensors bytes (what vLLM's RPC can carry without pickling); one call per bucket, so the
worker holds one bucket at a time.
"""

from __future__ import annotations

from typing import Any


class TwinkleWorkerExtension:
    """Mixed into vLLM's worker class; methods are called through ``LLM.collective_rpc(name, args=...)``."""

    model_runner: Any  # the vLLM worker's, which this class is mixed into

    def twinkle_load_weights(self, blob: bytes) -> int:
        """Copy the base weights in `blob` (Hugging Face names) into the model in place; returns how many."""
        from safetensors.torch import load

        weights = load(blob)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        if any(name.endswith('embed_tokens.weight') for name in weights):
            _refresh_tied_output_layer(self.model_runner.get_model())
        return len(weights)


def _refresh_tied_output_layer(model: object) -> None:
    """With tied embeddings, vLLM skips `lm_head.weight` when loading and reloads only the embedding layer; but
    on CPU the output layer computes logits with a GEMM prepared from its weight when it was processed after the
    first load (vLLM's `dispatch_cpu_unquantized_gemm` packs a copy). Re-process it so logits use the new
    embedding -- measured: without this, logprobs were off by up to 2.2 nats after an embedding update."""
    head = getattr(model, 'lm_head', None)
    head = getattr(head, 'base_layer', head)  # LoRA wraps the output layer
    embed = getattr(getattr(model, 'model', None), 'embed_tokens', None)
    embed = getattr(embed, 'base_layer', embed)
    weight, embed_weight = getattr(head, 'weight', None), getattr(embed, 'weight', None)
    method = getattr(head, 'quant_method', None)
    if weight is None or embed_weight is None or method is None or weight.data_ptr() != embed_weight.data_ptr():
        return
    method.process_weights_after_loading(head)
