"""Serves the Twinkle documents' ``twinkle.data_format`` (the data formats; code: `twinkle_core.types`)."""

from twinkle_core.types import InputFeature, SampledSequence, SampleResponse, SamplingParams, Trajectory

__all__ = ['InputFeature', 'SampledSequence', 'SampleResponse', 'SamplingParams', 'Trajectory']
