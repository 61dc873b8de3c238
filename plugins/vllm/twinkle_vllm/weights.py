"""Base weights on their way into a vLLM engine: checked against the checkpoint's own names and shapes (an unknown
name inside vLLM's worker would kill the engine), held until every weight of their layer has arrived, then cut
into buckets of whole layers serialised as safetensors bytes.

Why whole layers: vLLM reloads weights layer by layer into fused modules (q/k/v -> qkv_proj, gate/up ->
gate_up_proj); a reload call that carries only part of a fused module re-materialises the module with the missing
parts uninitialised. So nothing reaches the engine until its decoder layer (``model.layers.<i>.``; other names
stand alone) is complete, and a bucket never splits a layer.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from twinkle_core.errors import InvalidInputError
from twinkle_core.weight_sync.weights import canonical_name


@dataclass(frozen=True)
class CheckpointLayout:
    """Hugging Face weight name -> shape, as the model directory's safetensors files hold them. `tied`: names the
    checkpoint leaves out because they share storage with another (an untied copy is skipped, not an error)."""

    shapes: dict[str, tuple[int, ...]]
    tied: frozenset[str]

    @classmethod
    def read(cls, model_dir: str) -> CheckpointLayout:
        from safetensors import safe_open

        shapes: dict[str, tuple[int, ...]] = {}
        for file in sorted(Path(model_dir).glob('*.safetensors')):
            with safe_open(str(file), framework='pt') as f:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        if not shapes:
            raise InvalidInputError(
                f'{model_dir} has no *.safetensors weights; vLLMSampler needs a Hugging Face '
                'checkpoint in safetensors format.'
            )
        config_file = Path(model_dir) / 'config.json'
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        tied = frozenset({'lm_head.weight'} if config.get('tie_word_embeddings') else set())
        return cls(shapes, tied)

    def checked(self, pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """(canonical name, tensor) for every pair (no copies); raises on an unknown name or a wrong shape before
        anything is returned, so a bad update changes nothing."""
        out = []
        for name, tensor in pairs:
            key = canonical_name(name)
            expected = self.shapes.get(key)
            if expected is None:
                if key in self.tied:
                    continue
                close = [k for k in self.shapes if k.split('.')[-2:] == key.split('.')[-2:]][:3]
                raise InvalidInputError(
                    f'load_weights: no base weight named {name!r} in this model'
                    f'{"; similar: " + ", ".join(close) if close else ""}.'
                )
            if tuple(tensor.shape) != expected:
                raise InvalidInputError(
                    f'load_weights: {name!r} has shape {tuple(tensor.shape)}, the model expects {expected}.'
                )
            out.append((key, tensor))
        return out


def layer_key(name: str) -> str:
    """The reload unit a weight belongs to: the name up to its first integer segment (``model.layers.3``), or the
    name itself."""
    parts = name.split('.')
    for i, part in enumerate(parts):
        if part.isdigit():
            return '.'.join(parts[: i + 1])
    return name


class LayerStager:
    """Collects checked weights across `load_weights` calls of one update and releases whole layers."""

    def __init__(self, layout: CheckpointLayout) -> None:
        self._members: dict[str, set[str]] = defaultdict(set)
        for name in layout.shapes:
            self._members[layer_key(name)].add(name)
        self._pending: dict[str, dict[str, Any]] = defaultdict(dict)

    def add(self, pairs: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
        """Stage `pairs`; returns the layers now complete (each a list of pairs), removing them from the stage."""
        touched = []
        for name, tensor in pairs:
            key = layer_key(name)
            self._pending[key][name] = tensor
            touched.append(key)
        ready = []
        for key in dict.fromkeys(touched):
            if key in self._pending and self._pending[key].keys() == self._members[key]:
                ready.append(list(self._pending.pop(key).items()))
        return ready

    def incomplete(self) -> dict[str, list[str]]:
        """Layer -> its weights still missing (empty when nothing is staged)."""
        return {key: sorted(self._members[key] - got.keys()) for key, got in self._pending.items()}

    def clear(self) -> None:
        self._pending.clear()


def serialized_buckets(layers: Iterable[list[tuple[str, Any]]], bucket_bytes: int) -> Iterator[bytes]:
    """safetensors bytes of consecutive whole layers, each bucket at most `bucket_bytes` unless one layer is
    larger."""
    from safetensors.torch import save

    bucket: dict[str, Any] = {}
    size = 0
    for layer in layers:
        nbytes = sum(t.numel() * t.element_size() for _, t in layer)
        if bucket and size + nbytes > bucket_bytes:
            yield save(bucket)
            bucket, size = {}, 0
        bucket.update((name, t.detach().contiguous().cpu()) for name, t in layer)
        size += nbytes
    if bucket:
        yield save(bucket)
