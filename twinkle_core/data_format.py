"""The Twinkle documents' module path for the data formats: ``from twinkle_core.data_format import
SamplingParams`` (the one implementation of each is in `twinkle_core.types`)."""

from twinkle_core.types import InputFeature, SampledSequence, SampleResponse, SamplingParams, Trajectory

__all__ = ['InputFeature', 'SampledSequence', 'SampleResponse', 'SamplingParams', 'Trajectory']
