"""Kind `preprocessor`: the interface, plus lazy access to every registered preprocessor by name.

A preprocessor maps one raw dataset row to one `Trajectory` row (messages), in `Dataset.map`, before any
tokenization. Not to be confused with kind `processor` (`twinkle_core.processor`), which turns encoded rows into
model-ready tensors inside the model. Several preprocessors are named ``...Processor`` (``GSM8KProcessor``): the
Twinkle documents' names, kept.

Built-ins (entry points): SelfCognitionProcessor, AlpacaProcessor, MessagesProcessor, ShareGPTProcessor,
GSM8KProcessor. Row filters for `Dataset.filter`: `LengthFilter`, `LossTokensFilter`, `MessageLengthFilter`,
`Filter.from_callable`.
"""

from twinkle_core._lazy import kind_getattr
from twinkle_core.preprocessor.base import Filter, Preprocessor
from twinkle_core.preprocessor.filters import LengthFilter, LossTokensFilter, MessageLengthFilter

__all__ = ['Filter', 'LengthFilter', 'LossTokensFilter', 'MessageLengthFilter', 'Preprocessor']

__getattr__ = kind_getattr('preprocessor', __name__)
