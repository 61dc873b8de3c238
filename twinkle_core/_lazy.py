"""Seed-style imports: ``from twinkle_core.loss import GRPOLoss`` resolves a registered component lazily."""

from __future__ import annotations

from typing import Any, Callable

from twinkle_core.errors import ComponentNotFoundError, DistributionNotInstalledError
from twinkle_core.registry import resolve_class


def kind_getattr(kind: str, module_name: str) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that looks `name` up in the registry for `kind`.

    Raises AttributeError (not LookupError) on a miss so ``from pkg import submodule`` keeps working -- except
    for a name the registry index knows whose distribution is not installed: that raises
    `DistributionNotInstalledError` (an ImportError) so ``from pkg import Name`` says which ``pip install`` to run.
    """

    def __getattr__(name: str) -> Any:
        if name.startswith('_'):
            raise AttributeError(f'module {module_name!r} has no attribute {name!r}')
        try:
            return resolve_class(kind, name)
        except DistributionNotInstalledError:
            raise
        except ComponentNotFoundError as exc:
            raise AttributeError(f'module {module_name!r} has no attribute {name!r}.\n{exc}') from None

    return __getattr__
