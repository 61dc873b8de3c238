"""Kind `template`: the interface, plus lazy access to every registered template by name.

Built-ins (entry points): ``Template`` / ``ChatTemplate`` (any tokenizer with a chat template), ``Qwen3Template``.
"""

from twinkle_core._lazy import kind_getattr
from twinkle_core.template.base import Template

__all__ = ['Template']

__getattr__ = kind_getattr('template', __name__)
