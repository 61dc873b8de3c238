"""`SingleUnit`: the one trainable unit of a model that trains one -- all parameters, or the one LoRA adapter
`adapter_name` (None: full-parameter training) -- with its `TrainState`. The model owns one (TransformersModel) and
answers `list_adapters`, `_name` and `_state` (what `TrainStateMethods` needs) by asking it."""

from __future__ import annotations

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.state import TrainState


class SingleUnit:
    def __init__(self, state: TrainState, adapter_name: str | None = None) -> None:
        self.state = state
        self.adapter_name = adapter_name

    def adapters(self) -> list[str]:
        return [self.adapter_name] if self.adapter_name is not None else []

    def name(self, adapter_name: str | None) -> str | None:
        """The adapter a call addresses: the unit's one adapter (None under full-parameter training)."""
        if adapter_name is not None and adapter_name != self.adapter_name:
            trained = f'adapter {self.adapter_name!r}' if self.adapter_name else 'all parameters (no adapter)'
            raise InvalidInputError(f'Unknown adapter {adapter_name!r}: this model trains {trained}.')
        return self.adapter_name

    def state_for(self, adapter_name: str | None) -> TrainState:
        """The unit's `TrainState`, once `adapter_name` is checked to address it."""
        self.name(adapter_name)
        return self.state
