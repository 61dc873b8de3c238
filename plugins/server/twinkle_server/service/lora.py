"""Tinker's `lora_config` (rank, train_attn / train_mlp / train_unembed, seed) -> the adapter's target modules, in
Hugging Face / PEFT module names (the seam's naming)."""

from __future__ import annotations

from typing import Any

from twinkle_server.errors import unprocessable

ATTENTION = ('q_proj', 'k_proj', 'v_proj', 'o_proj')
MLP = ('gate_proj', 'up_proj', 'down_proj')


def lora_targets(tinker_lora: dict[str, Any]) -> tuple[str, ...]:
    """The module-name suffixes a Tinker `lora_config` trains (all three groups by default)."""
    targets: tuple[str, ...] = ()
    if tinker_lora.get('train_attn', True):
        targets += ATTENTION
    if tinker_lora.get('train_mlp', True):
        targets += MLP
    if tinker_lora.get('train_unembed', True):
        targets += ('lm_head',)
    if not targets:
        raise unprocessable('lora_config must train at least one of attention, MLP or unembedding')
    return targets
