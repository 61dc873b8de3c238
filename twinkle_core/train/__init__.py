"""The training machinery every model backend shares (docs/architecture.md, "Layers"): not an interface, but code
a backend imports to implement one. Torch is imported by the modules, so this package imports none of them.

- `state`: `TrainState`, everything one trainable unit needs to train (optimizer, LR scheduler, loss, processor,
  template, gradient accumulation, the optimizer step, metrics, resumable counters);
- `state_methods`: `TrainStateMethods`, the per-adapter `Model` methods written once over a `TrainState`, what
  the mixin needs from its host (`TrainStateHost`), and failure reporting (`reports_failure`);
- `single_unit`: `SingleUnit`, the one trainable unit of a model that trains one;
- `loss_step`: run a loss and check it, summarise a micro-batch, per-row log-probs, micro-batch loss weights;
- `row_keywords`: the documents' per-row keywords of `forward_backward` (``old_logps``, ``advantages``,
  ``micro_batch_size``) folded into rows;
- `checkpoint_dir`: backend-neutral checkpoint directories (atomic writes, metadata, training state, RNG);
- `grad_norm`: gradient-norm clipping correct for sharded (DTensor) gradients;
- `model_loading`: where a model's weights come from (local dir, hub) and where they are loaded (default device,
  dtype), and the tokenizer stored with them.
"""
