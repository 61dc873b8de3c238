"""Forward pass -> per-token log-probs -> loss: the computation every Transformers-backed model shares.

The pieces, in the order a training step uses them (see docs/conventions.md for the batch layout):

- `model_call_kwargs(batch)`: the tensors a Hugging Face causal LM takes from a collated batch;
- `forward_logps(model, batch, loss=...)`: run the model and return the loss's ``outputs`` dict
  (``logps``, ``mask``, ``target_logps``, ``correct`` and, when the loss asks for them, ``logits``);
- `run_loss(loss, batch, outputs)`: call the loss and check what it returned;
- `step_summary(batch, outputs, loss)`: the micro-batch numbers `TrainState.record` folds into the metrics;
- `rows_logprobs(batch, target_logps)`: per-row log-probs aligned with each row's ``input_ids``.

Log-probs are computed by `compute_logps` (from logits, in token chunks, without an fp32 copy of the whole
logits tensor) or by `compute_logps_from_hidden` (from the last hidden states and the output embedding, in
chunks, never materialising the [T, V] logits). Both return float32 and give the same values and gradients. A
loss chooses with ``logps_from_hidden_states``: True / False, or unset (None): the hidden-state path whenever the
batch's full fp32 logits would exceed one chunk (`CHUNK_BYTES`) and the output layer allows it
(`wants_hidden_state_logps`) -- the memory-bounded default of every loss that does not need the logits.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.chunking import CHUNK_BYTES, default_chunk_tokens, plain_output_layer, unwrap_causal_lm
from twinkle_core.types import IGNORE_INDEX
from twinkle_transformers import sequence_parallel, vision

logger = logging.getLogger(__name__)


def wants_hidden_state_logps(loss: object, num_tokens: int, vocab_size: int) -> bool:
    """Whether `loss`'s log-probs should come from the hidden states: never when it needs the full logits and
    cannot take the hidden states instead (``accepts_hidden_states``); its ``logps_from_hidden_states`` when set
    (True / False); else (None, unset) when `num_tokens` x `vocab_size` fp32 logits would exceed one chunk
    (`CHUNK_BYTES`), i.e. when full logits would cost more memory than the chunked path ever holds."""
    if getattr(loss, 'needs_logits', False) and not getattr(loss, 'accepts_hidden_states', False):
        return False
    choice = getattr(loss, 'logps_from_hidden_states', None)
    if choice is not None:
        return bool(choice)
    return num_tokens * vocab_size * 4 > CHUNK_BYTES


# ---- log-probs from logits ---------------------------------------------------------------------------------
class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(logits)[target] over [N, V] logits, in chunks of rows; saves only the logsumexp [N]."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, chunk: int) -> Tensor:
        n = logits.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        for s in range(0, n, chunk):
            x = logits[s : s + chunk].float()
            lse[s : s + chunk] = torch.logsumexp(x, dim=-1)
            out[s : s + chunk] = x.gather(1, targets[s : s + chunk, None]).squeeze(1) - lse[s : s + chunk]
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        grad_out = grad_out.float()
        for s in range(0, logits.shape[0], ctx.chunk):
            g = grad_out[s : s + ctx.chunk, None]
            d = _softmax_grad(logits[s : s + ctx.chunk].float(), lse[s : s + ctx.chunk], targets[s : s + ctx.chunk], g)
            grad[s : s + ctx.chunk] = d.to(grad.dtype)
        return grad, None, None


def _softmax_grad(x: Tensor, lse: Tensor, targets: Tensor, g: Tensor) -> Tensor:
    """d(g * log_softmax(x)[target]) / dx = g * (onehot(target) - softmax(x)); `x` is left untouched."""
    p = torch.sub(x, lse[:, None]).exp_().mul_(-g)
    return p.scatter_add_(1, targets[:, None], g)


def compute_logps(logits: Tensor, targets: Tensor, *, chunk_tokens: int | None = None) -> Tensor:
    """Log-probability of each target token: ``log_softmax(logits)[..., target]`` as float32.

    `logits` [..., V] (any float dtype; upcast chunk by chunk), `targets` [...] int with ``-100`` where there is
    no target (those positions get 0 and no gradient). Differentiable w.r.t. `logits`; the backward keeps only
    the logits (already alive) and a float32 logsumexp per token.
    """
    shape = targets.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    valid = flat_targets != IGNORE_INDEX
    safe_targets = torch.where(valid, flat_targets, 0)
    chunk = chunk_tokens or default_chunk_tokens(logits.shape[-1])
    logps = _TokenLogProbs.apply(flat_logits, safe_targets, chunk)
    return torch.where(valid, logps, 0.0).view(shape)


# ---- log-probs from hidden states (no [T, V] logits) -----------------------------------------------------
class _HiddenTokenLogProbs(torch.autograd.Function):
    """log_softmax(hidden @ weight.T)[target] in chunks of rows; the backward recomputes each chunk's logits.

    Returns (logps [N] float32, argmax [N] long). Peak extra memory: one chunk of fp32 logits.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk: int,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        argmax = torch.empty(n, dtype=torch.long, device=hidden.device)
        for s in range(0, n, chunk):
            x = (hidden[s : s + chunk] @ weight.T).float()
            lse[s : s + chunk] = torch.logsumexp(x, dim=-1)
            out[s : s + chunk] = x.gather(1, targets[s : s + chunk, None]).squeeze(1) - lse[s : s + chunk]
            argmax[s : s + chunk] = x.argmax(dim=-1)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        ctx.autocast = _autocast_state(hidden.device.type)  # the backward recomputes under the same autocast
        ctx.mark_non_differentiable(argmax)
        return out, argmax

    @staticmethod
    def backward(
        ctx: Any,
        grad_out: Tensor,
        _grad_argmax: Tensor | None,
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_out = grad_out.float()
        with torch.autocast(hidden.device.type, **ctx.autocast):
            for s in range(0, hidden.shape[0], ctx.chunk):
                h = hidden[s : s + ctx.chunk]
                x = (h @ weight.T).float()
                g = grad_out[s : s + ctx.chunk, None]
                d = _softmax_grad(x, lse[s : s + ctx.chunk], targets[s : s + ctx.chunk], g).to(hidden.dtype)
                if grad_h is not None:
                    grad_h[s : s + ctx.chunk] = d @ weight
                if grad_w is not None:
                    grad_w += (d.T @ h).float()
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None


def _autocast_state(device_type: str) -> dict[str, Any]:
    """``torch.autocast`` keyword arguments reproducing the autocast state active now on `device_type`."""
    return {'enabled': torch.is_autocast_enabled(device_type), 'dtype': torch.get_autocast_dtype(device_type)}


def compute_logps_from_hidden(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk_tokens: int | None = None
) -> tuple[Tensor, Tensor]:
    """Like `compute_logps(hidden @ weight.T, targets)` without materialising the logits.

    `hidden` [..., H] (the decoder's final hidden states), `weight` [V, H] (the output embedding, no bias).
    Returns ``(logps [...] float32, argmax [...] long)``; masked positions get logp 0. Differentiable w.r.t.
    `hidden` and `weight` (tied embeddings accumulate their gradient through `weight` as usual).
    """
    shape = targets.shape
    flat_targets = targets.reshape(-1)
    valid = flat_targets != IGNORE_INDEX
    chunk = chunk_tokens or default_chunk_tokens(weight.shape[0])
    logps, argmax = _HiddenTokenLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, torch.where(valid, flat_targets, 0), chunk
    )
    return torch.where(valid, logps, 0.0).view(shape), argmax.view(shape)


# ---- the forward pass -------------------------------------------------------------------------------------
def model_call_kwargs(batch: dict[str, Any], model: torch.nn.Module | None = None) -> dict[str, Any]:
    """Keyword arguments for a HF causal LM (or, given `model`, a vision-language model) from a collated batch.

    Packed batches carry no attention mask: transformers then derives the block-diagonal causal mask from the
    restarting ``position_ids`` (``use_cache=False`` is required for that detection, and right for training).
    Their sequence borders also go in as ``cu_seq_lens_q/k`` + ``max_length_q/k``, which flash-attention's varlen
    kernels and ``twinkle_sdpa`` use to attend per sequence; other attention implementations ignore them.
    """
    kwargs: dict[str, Any] = {
        'input_ids': batch['input_ids'],
        'position_ids': batch['position_ids'],
        'use_cache': False,
    }
    if batch.get('attention_mask') is not None:
        kwargs['attention_mask'] = batch['attention_mask']
    if batch.get('packed') and batch.get('cu_seqlens') is not None:
        cu = batch['cu_seqlens'].to(device=batch['input_ids'].device, dtype=torch.int32)
        kwargs.update(
            cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=batch['max_seqlen'], max_length_k=batch['max_seqlen']
        )
    if model is not None:
        config = getattr(unwrap_causal_lm(model), 'config', None)
        if config is not None and vision.is_vision_language(config):
            return vision.add_vision_inputs(model, config, batch, kwargs)
    if batch.get('pixel_values') is not None:
        if model is None:
            raise InvalidInputError(
                'The batch holds images but no model was given: pass model= (a vision-language model, e.g. '
                'Qwen3-VL) so that its image inputs are built.'
            )
        raise InvalidInputError(
            f'The batch holds images but {type(unwrap_causal_lm(model)).__name__} is a text-only '
            'model; train images on a vision-language model (e.g. Qwen3-VL).'
        )
    return kwargs


def hidden_state_output_layer(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The output layer when logps can be computed from hidden states, else None (callers then use full
    logits): a plain projection (`plain_output_layer`) of a model that is not a vision-language one."""
    if vision.is_vision_language(getattr(unwrap_causal_lm(model), 'config', None)):
        return None
    return plain_output_layer(model)


def _whole_weight(layer: torch.nn.Linear) -> Tensor:
    """`layer`'s weight after the forward: FSDP2 leaves the root module's parameters gathered after it (they
    are needed again at once by the backward); a weight still sharded is gathered (collective, differentiable)."""
    weight = layer.weight
    full_tensor = getattr(weight, 'full_tensor', None)  # a DTensor
    return full_tensor() if callable(full_tensor) else weight


@contextmanager
def _output_layer_skipped(model: torch.nn.Module) -> Iterator[None]:
    """While open, `model`'s forward returns its final hidden states as ``logits`` (its output layer is an
    identity). The root module is what runs -- not its decoder alone -- so the forward hooks of a data-parallel
    wrapper on it (DDP's gradient synchronisation) fire as for any forward."""
    causal_lm: Any = unwrap_causal_lm(model)
    head = causal_lm.get_output_embeddings()
    causal_lm.set_output_embeddings(torch.nn.Identity())
    try:
        yield
    finally:
        causal_lm.set_output_embeddings(head)


def forward_logps(model: torch.nn.Module, batch: dict[str, Any], *, loss: object = None) -> dict[str, Tensor]:
    """Run `model` on a collated batch and build the loss's ``outputs`` dict. `loss`: the `Loss` to feed, or any
    object with the attributes read below (e.g. the merged needs of several losses); None: no loss.

    Returns ``target_logps`` [B, T] (log p of ``target_ids``: the next input token, or the label where one is
    set; 0 at row ends and padding), ``logps`` (the same, 0 where ``labels == -100``), ``mask`` (labels != -100),
    ``correct`` (argmax == label, bool, no grad) and, when ``loss.needs_logits``, ``logits`` -- or, for a loss
    that ``accepts_hidden_states`` when the log-probs come from them, ``hidden_states`` [B, T, H] and
    ``output_weight`` [V, H] (``logits == hidden_states @ output_weight.T``) instead. Runs under the
    caller's grad mode. Log-probs come from the hidden states when `wants_hidden_state_logps` says so and the
    output layer allows it (`hidden_state_output_layer`), else from full logits. A loss may set ``chunk_tokens`` (tokens
    per log-prob chunk), and one that sets ``logps_from_hidden_states`` may compute them itself:
    ``logps_from_hidden(hidden, weight, targets) -> (logps, argmax)`` (same contract as
    `compute_logps_from_hidden`).
    """
    chunk_tokens = getattr(loss, 'chunk_tokens', None)
    needs_logits = bool(getattr(loss, 'needs_logits', False))
    labels = batch['labels']
    config = getattr(unwrap_causal_lm(model), 'config', None)
    get_text_config = getattr(config, 'get_text_config', None)
    text_config = get_text_config() if callable(get_text_config) else config
    vocab_size = int(getattr(text_config, 'vocab_size', 0) or 0)
    from_hidden = wants_hidden_state_logps(loss, batch['target_ids'].numel(), vocab_size)
    output_layer = hidden_state_output_layer(model) if from_hidden else None
    if output_layer is None and getattr(loss, 'logps_from_hidden_states', None) and not needs_logits:
        logger.warning(
            "%s asked for log-probs from hidden states, but this model's output layer does not allow it "
            '(adapted, biased or post-processed logits); computing full logits instead.',
            type(loss).__name__,
        )
    call_batch, shard = _split_sequence(model, batch)
    call_kwargs = model_call_kwargs(call_batch, model)
    if shard is not None:
        call_kwargs[sequence_parallel.SHARD_KWARG] = shard
    targets = call_batch['target_ids']
    outputs: dict[str, Tensor] = {}
    if output_layer is not None:
        with _output_layer_skipped(model):
            hidden = model(**call_kwargs).logits
        weight = _whole_weight(output_layer)
        custom = getattr(loss, 'logps_from_hidden', None)  # e.g. a fused (Liger) linear cross-entropy
        target_logps, argmax = (
            custom(hidden, weight, targets)
            if custom is not None
            else compute_logps_from_hidden(hidden, weight, targets, chunk_tokens=chunk_tokens)
        )
        if needs_logits:  # a loss that accepts_hidden_states computes its logits in chunks itself
            outputs.update(hidden_states=hidden, output_weight=weight)
    else:
        logits = model(**call_kwargs).logits
        target_logps = compute_logps(logits, targets, chunk_tokens=chunk_tokens)
        with torch.no_grad():
            argmax = logits.argmax(dim=-1)
        if needs_logits:
            outputs['logits'] = logits
    if shard is not None:  # every loss runs on whole rows
        target_logps, argmax = (sequence_parallel.gather_sequence(x, shard) for x in (target_logps, argmax))
        for name in ('logits', 'hidden_states'):
            if name in outputs:
                outputs[name] = sequence_parallel.gather_sequence(outputs[name], shard)
    mask = labels != IGNORE_INDEX
    outputs.update(
        target_logps=target_logps,
        logps=torch.where(mask, target_logps, 0.0),
        mask=mask,
        correct=(argmax == labels) & mask,
    )
    return outputs


def _split_sequence(
    model: torch.nn.Module, batch: dict[str, Any]
) -> tuple[dict[str, Any], sequence_parallel.SequenceShard | None]:
    """The batch this rank runs the model on: its slice of the sequence when `model` splits sequences over
    ranks (`sequence_parallel`), else `batch` itself."""
    group = sequence_parallel.group_of(model)
    if group is None:
        return batch, None
    return sequence_parallel.shard_batch(batch, group)
