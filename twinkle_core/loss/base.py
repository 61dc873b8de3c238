"""The Loss interface.

Contract (all losses):
- `inputs`: the collated batch from the model's input processor: ``labels`` [B, T] already **shifted** so that
  ``labels[:, t]`` is the token predicted at position t (-100 = no loss), plus any per-token fields shifted the
  same way (``advantages``, ``old_logps``, ``ref_logps``, ``weights`` ...) and per-row fields.
- `outputs`: the forward's results: ``logps`` [B, T] = log-prob of ``labels[:, t]`` (0 where masked), ``mask``
  [B, T] bool, and ``logits`` [B, T, V] when the loss declares ``needs_logits = True``. Transformers-backed models
  also give ``target_logps`` (log-prob of ``target_ids``, every next token) and ``correct`` (argmax == label).
  A value model (a scalar head, e.g. ``TransformersValueModel``) gives ``values`` [B, T] in place of ``logps``,
  to the losses that declare ``needs_values = True``.
- optional class attributes a model honours: ``logps_from_hidden_states`` (True: compute ``logps`` from the final
  hidden states and the output embedding in chunks, never materialising [T, V] logits; False: from full logits;
  unset / None: the chunked path when the batch's full logits would be large -- the Transformers backend's rule
  is `twinkle_transformers.forward.wants_hidden_state_logps`), ``chunk_tokens`` and ``accepts_hidden_states``
  (a ``needs_logits`` loss that can take ``hidden_states`` [B, T, H] + ``output_weight`` [V, H] in place of
  ``logits`` and compute them in chunks itself: it is given those whenever the log-probs come from the hidden
  states, and ``logits`` otherwise).
- ``reduction`` (``'token_mean'`` | ``'sum'`` | ``'sequence_mean'``): models divide the loss by the number of
  gradient-accumulation steps unless it is ``'sum'`` (docs/conventions.md).
- returns a `LossOutput` dict: ``loss`` (scalar tensor to backpropagate) and optional float metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, TypedDict, cast

#: how a loss reduces over its tokens (the ``reduction`` attribute, docs/conventions.md)
REDUCTIONS: tuple[str, ...] = ('token_mean', 'sum', 'sequence_mean')


class LossOutput(TypedDict, total=False):
    loss: Any  # scalar torch.Tensor
    num_tokens: int
    metrics: dict[str, float]


class Loss(ABC):
    needs_logits: bool = False  # True: the model must keep full logits in `outputs['logits']`
    # True: the loss reads `outputs['values']` [B, T], a value head's output (value models only, e.g. PPOValueLoss)
    needs_values: bool = False
    # with needs_logits: the loss also takes `hidden_states` + `output_weight` in place of `logits` (see above)
    accepts_hidden_states: bool = False
    # Log-probs from the hidden states in chunks (True), from full logits (False), or by the batch's size (None).
    logps_from_hidden_states: bool | None = None
    # How the loss reduces over tokens (docs/conventions.md): 'token_mean' | 'sequence_mean' | 'sum'. Gradient
    # accumulation divides each micro-batch's loss by the number of micro-batches unless it is 'sum'.
    reduction: str = 'token_mean'
    # Which of forward_backward's row keywords (``old_logps=``, ``advantages=``) the loss reads; a keyword given
    # for a loss that does not read it is refused. None: not declared (custom losses): nothing is checked.
    row_keywords: frozenset[str] | None = None
    # True: each row's loss depends on that row alone (no pairs, no batch statistics), so a model may run a call's
    # rows in several passes, each weighted by its share of the reduction, with the gradients of one pass.
    rows_independent: bool = False

    @abstractmethod
    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        """Compute the loss of one (micro-)batch."""

    @classmethod
    def from_callable(cls, fn: Callable[..., Any], **init_args: Any) -> Loss:
        """Wrap ``fn(inputs, outputs, **kwargs) -> tensor | LossOutput`` as a Loss."""
        return _CallableLoss(fn, **init_args)


class _CallableLoss(Loss):
    def __init__(self, fn: Callable[..., Any], needs_logits: bool = False, **kwargs: Any) -> None:
        self.fn, self.needs_logits, self.kwargs = fn, needs_logits, kwargs
        self.__name__ = getattr(fn, '__name__', 'custom_loss')

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        out = self.fn(inputs, outputs, **{**self.kwargs, **kwargs})
        # a dict return is a LossOutput by `from_callable`'s contract
        return cast(LossOutput, out) if isinstance(out, dict) else LossOutput(loss=out)
