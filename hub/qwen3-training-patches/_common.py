"""Helpers shared by the patches of this repo (imported relatively: the repo folder is loaded as one package)."""
from __future__ import annotations

from typing import Any, Iterator


def modules_named(model: Any, class_names: tuple[str, ...]) -> Iterator[Any]:
    """Submodules of `model` whose class name is one of `class_names` (no import of the modeling module)."""
    for module in model.modules():
        if type(module).__name__ in class_names:
            yield module
