"""Hugging Face config -> Megatron-Core `TransformerConfig` arguments, and the checks that a layout fits a model.

Supported families (the dense decoders with RMSNorm, SwiGLU and RoPE, and Qwen3-MoE):

| HF ``model_type`` | what differs                                   |
|-------------------|------------------------------------------------|
| ``qwen3``         | per-head q/k RMSNorm (``qk_layernorm``)        |
| ``qwen2``         | bias on the q/k/v projections                  |
| ``llama``         | none (plain GQA); rope scaling is rejected     |
| ``qwen3_moe``     | q/k norm, every layer a routed MoE MLP         |

Anything else fails at construction with `UnsupportedModelError` naming what is supported. `check_layout`
rejects layouts Megatron cannot split the model into (tp not dividing the heads, pp larger than the layers, ...)
with a message saying why, before any weight is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle_core.errors import MeshError, TwinkleError

SUPPORTED = ('qwen3', 'qwen2', 'llama', 'qwen3_moe')


class UnsupportedModelError(TwinkleError):
    """The checkpoint's architecture has no Megatron conversion here."""


@dataclass(frozen=True)
class Layout:
    """How the model is split: tensor (tp, with sequence parallelism `sp`), pipeline (pp, `vpp` virtual stages
    per rank), data (dp) and expert (ep) parallel sizes."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1
    sp: bool = False
    ep: int = 1


@dataclass(frozen=True)
class Architecture:
    """The facts conversion and construction need, read once from the HF config."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool
    qkv_bias: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_top_k: int | None = None
    moe_norm_top_k: bool = True
    #: the output layer is a scalar head (a value / reward model, `twinkle_megatron.value_head`), not the LM head
    value_head: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None


def _rope_theta(config: Any) -> float:
    params = getattr(config, 'rope_parameters', None) or getattr(config, 'rope_scaling', None) or {}
    rope_type = params.get('rope_type', params.get('type', 'default')) if isinstance(params, dict) else 'default'
    if rope_type not in (None, 'default'):
        raise UnsupportedModelError(
            f'RoPE scaling {rope_type!r} is not converted to Megatron here; only plain RoPE '
            f'(rope_type "default") is supported.'
        )
    theta = params.get('rope_theta') if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(config, 'rope_theta', 10000.0))


def architecture_of(config: Any) -> Architecture:
    """Read a `transformers.PretrainedConfig`; raises `UnsupportedModelError` for other architectures."""
    model_type = getattr(config, 'model_type', None)
    if model_type not in SUPPORTED:
        architecture = (getattr(config, 'architectures', None) or ['?'])[0]
        raise UnsupportedModelError(
            f'MegatronModel converts {", ".join(SUPPORTED)} checkpoints; this one is '
            f'model_type={model_type!r} ({architecture}). Train it with TransformersModel.'
        )
    heads = config.num_attention_heads
    moe: dict[str, Any] = {}
    if model_type == 'qwen3_moe':
        dense = list(getattr(config, 'mlp_only_layers', []) or [])
        if dense or getattr(config, 'decoder_sparse_step', 1) != 1:
            raise UnsupportedModelError(
                'Qwen3-MoE checkpoints with dense layers (mlp_only_layers / '
                'decoder_sparse_step != 1) are not converted; every layer must be MoE.'
            )
        moe = {
            'num_experts': config.num_experts,
            'moe_ffn_hidden_size': config.moe_intermediate_size,
            'moe_top_k': config.num_experts_per_tok,
            'moe_norm_top_k': bool(config.norm_topk_prob),
        }
    if getattr(config, 'hidden_act', 'silu') != 'silu':
        raise UnsupportedModelError(f'hidden_act={config.hidden_act!r}: only SwiGLU (silu) MLPs are converted.')
    return Architecture(
        model_type=model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(config, 'num_key_value_heads', None) or heads,
        head_dim=getattr(config, 'head_dim', None) or config.hidden_size // heads,
        ffn_hidden_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        tied_embeddings=bool(getattr(config, 'tie_word_embeddings', False)),
        qk_norm=model_type in ('qwen3', 'qwen3_moe'),
        qkv_bias=model_type == 'qwen2' or bool(getattr(config, 'attention_bias', False)),
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=_rope_theta(config),
        max_position_embeddings=config.max_position_embeddings,
        **moe,
    )


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = 128) -> int:
    """The vocabulary rounded up so that it splits evenly over `tp` ranks (in blocks of `multiple` rows each,
    as Megatron does); the padded rows are zero and their logits are masked out of every log-prob."""
    step = multiple * tp
    return -(-vocab_size // step) * step


def check_layout(arch: Architecture, layout: Layout) -> None:
    """Raise `MeshError` saying why the model cannot be split this way (before anything is built)."""
    problems = []
    if arch.num_heads % layout.tp:
        problems.append(f'tp={layout.tp} does not divide the {arch.num_heads} attention heads')
    if arch.num_kv_heads % layout.tp:
        problems.append(f'tp={layout.tp} does not divide the {arch.num_kv_heads} key/value heads (GQA groups)')
    stages = layout.pp * layout.vpp
    if stages > arch.num_layers:
        problems.append(
            f'pp={layout.pp} x vpp={layout.vpp} = {stages} pipeline stages but the model has only '
            f'{arch.num_layers} layers'
        )
    elif arch.num_layers % stages:
        problems.append(
            f'the {arch.num_layers} layers do not split evenly over pp={layout.pp} x vpp={layout.vpp} '
            f'= {stages} pipeline stages'
        )
    if layout.vpp > 1 and layout.pp < 2:
        problems.append(f'virtual pipeline stages (vpp={layout.vpp}) need pp >= 2')
    if layout.sp and layout.tp < 2:
        problems.append('sequence parallelism needs tp >= 2')
    if layout.ep > 1:
        if arch.num_experts is None:  # not arch.is_moe
            problems.append(f'ep={layout.ep} but the model has no experts')
        elif arch.num_experts % layout.ep:
            problems.append(f'ep={layout.ep} does not divide the {arch.num_experts} experts')
    if problems:
        raise MeshError(
            f'Cannot split {arch.model_type} ({arch.num_layers} layers, {arch.num_heads} heads, '
            f'{arch.num_kv_heads} kv heads) over {layout}: ' + '; '.join(problems) + '.'
        )


def transformer_config_kwargs(arch: Architecture, layout: Layout, dtype: Any) -> dict[str, Any]:
    """Arguments of `megatron.core.transformer.TransformerConfig` for `arch` split by `layout` in `dtype`.

    Fusions that need CUDA kernels (bias-activation, masked softmax, RoPE, gradient-accumulation) are off: the
    local (non-TransformerEngine) layer spec runs the plain PyTorch paths, equal to Hugging Face in fp32."""
    import torch
    import torch.nn.functional as F

    kwargs: dict[str, Any] = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization='RMSNorm',
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        sequence_parallel=layout.sp,
        expert_model_parallel_size=layout.ep,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=True,
        perform_initialization=False,
        # p2p on gloo must not be batched (virtual pipeline is silently wrong otherwise); the loss is scaled here
        batch_p2p_comm=False,
        calculate_per_token_loss=True,
    )
    if layout.vpp > 1:
        kwargs['virtual_pipeline_model_parallel_size'] = layout.vpp
    if arch.is_moe:
        kwargs.update(
            num_moe_experts=arch.num_experts,
            moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
            moe_router_topk=arch.moe_top_k,
            moe_router_pre_softmax=not arch.moe_norm_top_k,
            moe_router_load_balancing_type='none',
            moe_aux_loss_coeff=0.0,
            moe_token_dispatcher_type='allgather',
        )
    return kwargs
