"""Serves the Twinkle documents' ``twinkle.preprocessor.llm.<Name>``: any registered preprocessor, by name."""

from twinkle_core._lazy import kind_getattr

__getattr__ = kind_getattr('preprocessor', __name__)
