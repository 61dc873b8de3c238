"""Serves the Twinkle documents' ``twinkle.server.common.input_feature_to_datum`` (code: `compat.tinker`)."""

from twinkle_core.compat.tinker import input_feature_to_datum

__all__ = ['input_feature_to_datum']
