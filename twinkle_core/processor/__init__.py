"""Kind `processor`: the interface, plus lazy access to every registered processor by name.

A processor (`InputProcessor`) turns a batch of encoded rows (`InputFeature`: ``input_ids``, ``labels``, ...) into
model-ready tensors -- padding or packing, label shifting -- inside the model (`set_processor`). Not to be confused
with kind `preprocessor` (`twinkle_core.preprocessor`), which maps raw dataset rows to `Trajectory` rows in
`Dataset.map`, before tokenization. The word is the kind's (entry-point group ``twinkle.processor``,
`set_processor`, the Twinkle documents' ``InputProcessor``), so the package keeps it.
"""

from twinkle_core._lazy import kind_getattr
from twinkle_core.processor.base import InputProcessor

__all__ = ['InputProcessor']

__getattr__ = kind_getattr('processor', __name__)
