"""`RewardModelReward`: score completions with a trained reward model (a scalar head read after the last token).

The reward model is any model backend whose `forward_only` returns ``scores`` per row -- the Transformers
plugin's ``TransformersValueModel``, trained with `BradleyTerryLoss`, or a Hugging Face sequence-classification
reward model directory. Given a path, it is built through the registry by name (``backend``) and a LoRA
``checkpoint`` is loaded into it; given a model object (local, or on a Ray group with ``remote_group=``), it is used
as it is. Each trajectory (prompt turns + the completion as the last assistant message) is encoded with the chat
``template`` and scored in batches without gradients.

    reward = RewardModelReward('path/to/base', checkpoint='out/rm/final')
    rewards = reward(trajectories)
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.registry import resolve
from twinkle_core.reward.answers import completion_text
from twinkle_core.reward.base import Reward

DEFAULT_BACKEND = 'TransformersValueModel'


class RewardModelReward(Reward):
    """A reward model as a reward (kind ``reward``, name ``RewardModelReward``).

    Args:
        model: a checkpoint directory / model id (built as ``backend`` by name) or a model object.
        checkpoint: a LoRA (or full) checkpoint loaded into a model built here.
        template: chat template object or registered name; default the ``Template`` of `model`'s tokenizer
            (required for a model object without ``model_dir``).
        batch_size: trajectories per forward. adapter_name: the model's adapter to score with (multi-adapter).
        scale, shift: the reward is ``scale * (score - shift)`` (e.g. centre a reward model's scores).
        **model_args: constructor arguments of the backend (``device``, ``dtype`` ...).
    """

    def __init__(
        self,
        model: Any,
        *,
        checkpoint: str | None = None,
        backend: str = DEFAULT_BACKEND,
        template: Any = None,
        batch_size: int = 16,
        adapter_name: str | None = None,
        scale: float = 1.0,
        shift: float = 0.0,
        **model_args: Any,
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError(f'RewardModelReward: batch_size must be >= 1, got {batch_size}.')
        if isinstance(model, (str, os.PathLike)):
            model = resolve('model', backend, model_id=str(model), **model_args)
            if checkpoint is not None:
                model.load(checkpoint)
        elif checkpoint is not None or model_args:
            raise InvalidInputError(
                'RewardModelReward: checkpoint= and model arguments apply to a model built here (model= a path); '
                'load them into your model object yourself.'
            )
        self.model, self.batch_size, self.adapter_name = model, batch_size, adapter_name
        self.scale, self.shift = float(scale), float(shift)
        if template is None:
            model_dir = getattr(model, 'model_dir', None)
            if model_dir is None:
                raise InvalidInputError('RewardModelReward: give template= for a model object without model_dir.')
            template = resolve('template', 'Template', model_id_or_tokenizer=str(model_dir))
        self.template = resolve('template', template) if isinstance(template, str) else template

    def __call__(self, trajectories: Sequence[dict[str, Any]], **kwargs: Any) -> list[float]:
        rows = []
        for i, trajectory in enumerate(trajectories):
            completion_text(trajectory, i, 'RewardModelReward')  # the completion must be the last message
            rows.append({'input_ids': self.template.encode(trajectory)['input_ids']})
        scores: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            out = self.model.forward_only(
                inputs=rows[start : start + self.batch_size], adapter_name=self.adapter_name, compute_loss=False
            )
            if 'scores' not in out:
                raise InvalidInputError(
                    f'RewardModelReward: {type(self.model).__name__}.forward_only returned no scores; a reward model '
                    f'is a model with a scalar head ({DEFAULT_BACKEND}).'
                )
            scores.extend(float(s) for s in out['scores'])
        return [self.scale * (s - self.shift) for s in scores]
