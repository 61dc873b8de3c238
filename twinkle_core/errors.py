"""Exceptions raised by twinkle_core. Each message says what was wrong and what to do next."""

from __future__ import annotations


class TwinkleError(Exception):
    """Base class of every error twinkle_core raises on purpose."""


class ComponentNotFoundError(TwinkleError, LookupError):
    """A component name that no registration, entry point, index entry or hub reference provides."""


class PluginLoadError(TwinkleError, ImportError):
    """An installed plugin's entry point failed to import."""


class DistributionNotInstalledError(ComponentNotFoundError, ImportError):
    """A name the curated registry knows, whose providing distribution is not installed (also an ImportError,
    so ``from twinkle_core.model import MegatronModel`` fails with the ``pip install`` line)."""


class HubError(TwinkleError):
    """A hub reference that cannot be parsed, downloaded, verified or trusted."""


class UntrustedRemoteCodeError(HubError):
    """Hub code that is neither pinned in registry/ nor explicitly trusted."""


class IntegrityError(HubError):
    """Downloaded hub files whose sha256 differs from the pin in registry/."""


class InvalidInputError(TwinkleError, ValueError):
    """Bad user input (a data row, a batch, a config value)."""


class MeshError(TwinkleError, ValueError):
    """An inconsistent DeviceMesh or DeviceGroup specification."""
