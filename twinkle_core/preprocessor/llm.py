"""The Twinkle documents' module path for the text preprocessors: ``from twinkle_core.preprocessor.llm import
GSM8KProcessor`` resolves any registered preprocessor by name, like ``twinkle_core.preprocessor``."""

from twinkle_core._lazy import kind_getattr

__getattr__ = kind_getattr('preprocessor', __name__)
