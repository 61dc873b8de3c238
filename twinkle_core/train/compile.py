"""Regional compilation: ``torch.compile`` applied to each repeated block (decoder layer) of a model in place,
the option backends expose as ``compile_layers``.

Blocks of the same class share one compiled graph, so compile time is that of one block; what runs between them
(embeddings, the final norm, the loss) stays eager. ``compile_layers=True`` means the ``inductor`` backend; a
string names another ``torch.compile`` backend (``'aot_eager'`` traces forward and backward without generating
code: a cheap check that a model compiles).
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from twinkle_core.errors import InvalidInputError

DEFAULT_COMPILE_BACKEND = 'inductor'


def compile_backend(compile_layers: bool | str) -> str | None:
    """The ``torch.compile`` backend `compile_layers` asks for (None: do not compile)."""
    if compile_layers is False or compile_layers is None:
        return None
    if compile_layers is True:
        return DEFAULT_COMPILE_BACKEND
    if not isinstance(compile_layers, str) or not compile_layers:
        raise InvalidInputError(
            f'compile_layers must be True, False or a torch.compile backend name; got {compile_layers!r}.'
        )
    return compile_layers


def compile_blocks(blocks: Iterable[nn.Module], compile_layers: bool | str) -> str | None:
    """Compile every module of `blocks` in place (`nn.Module.compile`); returns the backend, None if none."""
    backend = compile_backend(compile_layers)
    if backend is not None:
        for block in blocks:
            block.compile(backend=backend)
    return backend
