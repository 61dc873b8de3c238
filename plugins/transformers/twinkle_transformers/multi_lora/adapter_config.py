"""An adapter's LoRA configuration: normalised to a `peft.LoraConfig`, checked, and resolved against a model.

Module matching is peft's own (`check_target_module_exists`: names, suffixes, regex, `exclude_modules`,
`layers_to_transform`), and per-module rank/alpha follow `rank_pattern` / `alpha_pattern` exactly like peft, so
an adapter targets the same modules here as it would under `peft.get_peft_model` and a saved adapter loads in
peft unchanged.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import nn

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.multi_lora.layer import MultiLoraLinear

ALL_LINEAR = 'all-linear'

# LoraConfig fields that change what a LoRA layer computes and that this engine does not implement.
_UNSUPPORTED: dict[str, Any] = {
    'use_dora': False,
    'modules_to_save': None,
    'bias': 'none',
    'lora_bias': False,
    'fan_in_fan_out': False,
    'target_parameters': None,
    'trainable_token_indices': None,
    'layer_replication': None,
    'use_qalora': False,
    'alora_invocation_tokens': None,
}


@dataclass(frozen=True)
class ModuleLoraShape:
    """Rank and alpha of one adapter on one module (they may differ per module via rank/alpha patterns)."""

    r: int
    lora_alpha: float


def to_lora_config(config: Any) -> Any:
    """A `peft.LoraConfig` from a LoraConfig, a dict of its fields, or None (peft defaults); a private copy."""
    from peft import LoraConfig

    if config is None:
        config = {}
    if isinstance(config, LoraConfig):
        config = copy.deepcopy(config)
    elif isinstance(config, dict):
        try:
            config = LoraConfig(**config)
        except TypeError as exc:
            raise InvalidInputError(
                f'Invalid LoRA config {config!r}: {exc}. Use the fields of peft.LoraConfig '
                '(r, lora_alpha, lora_dropout, target_modules, use_rslora, ...).'
            ) from exc
    else:
        raise InvalidInputError(f'LoRA config must be a peft.LoraConfig or a dict, got {type(config).__name__}.')
    _check_supported(config)
    return config


def _check_supported(config: Any) -> None:
    for field, default in _UNSUPPORTED.items():
        value = getattr(config, field, default)
        if value != default and not (default is None and not value):
            raise InvalidInputError(
                f'LoraConfig.{field}={value!r} is not supported by the multi-LoRA engine '
                f'(leave it at {default!r}); use TransformersModel for this adapter.'
            )
    init = config.init_lora_weights
    if not (init is True or init is False or (isinstance(init, str) and init.lower() == 'gaussian')):
        raise InvalidInputError(
            f"LoraConfig.init_lora_weights={init!r} is not supported; use True, False or 'gaussian'."
        )
    if config.r <= 0:
        raise InvalidInputError(f'LoRA rank r must be a positive integer, got {config.r}.')
    if not 0.0 <= config.lora_dropout < 1.0:
        raise InvalidInputError(f'lora_dropout must be in [0, 1), got {config.lora_dropout}.')
    if config.use_rslora and (config.rank_pattern or config.alpha_pattern):
        raise InvalidInputError('use_rslora cannot be combined with rank_pattern/alpha_pattern (peft forbids it).')


def linear_module_names(model: nn.Module, *, include_output: bool = False) -> list[str]:
    """Names of every `nn.Linear` of `model`, without the output embedding unless `include_output` (peft's
    'all-linear' leaves it out; a config may still name it, e.g. ``lm_head``).

    Modules already wrapped by `MultiLoraLinear` count as the Linear they wrap; their insides do not.
    """
    get_output = getattr(model, 'get_output_embeddings', None)  # an HF PreTrainedModel's
    output = get_output() if get_output is not None and not include_output else None
    inside = {
        id(sub)
        for wrapper in model.modules()
        if isinstance(wrapper, MultiLoraLinear)
        for sub in wrapper.modules()
        if sub is not wrapper
    }
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, MultiLoraLinear))
        and id(module) not in inside
        and (output is None or module is not output and getattr(module, 'base_layer', None) is not output)
    ]


def resolve_targets(model: nn.Module, config: Any) -> dict[str, ModuleLoraShape]:
    """The modules `config` targets in `model` (name -> rank/alpha there). Raises when nothing matches.

    'all-linear' is replaced, in the returned config semantics, by the explicit module list (as peft does).
    """
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    if config.target_modules is None:
        raise InvalidInputError("LoraConfig.target_modules is required (e.g. ['q_proj', 'v_proj'] or 'all-linear').")
    all_linear = isinstance(config.target_modules, str) and config.target_modules.lower() == ALL_LINEAR
    candidates = linear_module_names(model, include_output=not all_linear)
    probe = copy.copy(config)
    if all_linear:
        probe.target_modules = set(candidates)
    targets: dict[str, ModuleLoraShape] = {}
    rank_pattern, alpha_pattern = config.rank_pattern or {}, config.alpha_pattern or {}
    for name in candidates:
        if not check_target_module_exists(probe, name):  # False, None or peft's (falsy) excluded marker
            continue
        r_key, a_key = get_pattern_key(list(rank_pattern), name), get_pattern_key(list(alpha_pattern), name)
        targets[name] = ModuleLoraShape(
            r=rank_pattern.get(r_key, config.r), lora_alpha=alpha_pattern.get(a_key, config.lora_alpha)
        )
    if not targets:
        raise InvalidInputError(
            f'target_modules={config.target_modules!r} matches no Linear module of the model. '
            f'Linear modules look like: {candidates[:8]}.'
        )
    return targets


def saveable_config(config: Any, targets: dict[str, ModuleLoraShape], base_model_name_or_path: str | None) -> Any:
    """A copy of `config` to write next to the weights: 'all-linear' made explicit, base model recorded."""
    out = copy.deepcopy(config)
    if isinstance(out.target_modules, str) and out.target_modules.lower() == ALL_LINEAR:
        out.target_modules = sorted(targets)
    if out.task_type is None:
        out.task_type = 'CAUSAL_LM'
    out.base_model_name_or_path = base_model_name_or_path
    out.inference_mode = True
    return out
