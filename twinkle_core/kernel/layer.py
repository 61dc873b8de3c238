"""Layer kernels: the forward of every module tagged with a layer name (``kernel_layer_name``, as Hugging Face
``kernels`` tags them, e.g. transformers' ``@use_kernel_forward_from_hub("RMSNorm")``) replaced by a kernel
layer's forward, through ``kernels.kernelize``.

    from twinkle_core.kernel import apply_kernels
    apply_kernels(model, ['RMSNorm', 'SwiGLUMLP'], mode='training', device='cpu')   # -> {'RMSNorm': 9, ...}

One `apply_kernels` call installs one set: ``kernelize`` gives every other tagged module its original forward
back. Classes their library did not tag are tagged with ``replace_kernel_forward_from_hub`` (the kernel's
`decorates`). Nothing is changed when a kernel would replace no module, or is not available on the device.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.kernel.base import MODES, Kernel, KernelMode
from twinkle_core.registry import resolve

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class LayerKernel(Kernel):
    """`layer`: the ``nn.Module`` subclass whose ``forward`` replaces that of every module tagged `replaces` (the
    ``kernels`` rules: no ``__init__``, no extra members, the replaced forward's signature). `devices`: the
    device types it runs on (a ``torch-universal`` build: any). `source`: where it came from (for reports)."""

    name: str
    layer: type[Any]
    replaces: str = ''
    decorates: tuple[str, ...] = ()
    devices: tuple[str, ...] = ('cpu', 'cuda')
    source: str = ''
    _repository: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.replaces = self.replaces or self.name

    def is_available(self, device_type: str) -> bool:
        return device_type in self.devices

    def apply(self, model: Any, *, mode: KernelMode = 'training', device: str = 'cpu') -> int:
        return apply_kernels(model, [self], mode=mode, device=device)[self.name]

    @property
    def repository(self) -> Any:
        """A ``kernels`` layer repository handing out the already loaded (and verified) `layer`."""
        if self._repository is None:
            self._repository = _LoadedLayer(self.name, self.layer)
        return self._repository


class _LoadedLayer:
    """What ``kernels`` calls a layer repository: ``load()`` returns the layer class (here: already imported)."""

    def __init__(self, layer_name: str, layer: type) -> None:
        self.layer_name, self._layer = layer_name, layer

    def load(self) -> type:
        return self._layer

    def __str__(self) -> str:
        return f'{self._layer.__module__}.{self._layer.__qualname__}'


def resolve_kernels(kernels: Iterable[Any]) -> list[Kernel]:
    """Kernel instances for `kernels` (names, ``hf://org/repo@rev:Layer`` references or instances)."""
    out = []
    for spec in kernels:
        kernel = resolve('kernel', spec)
        if not isinstance(kernel, Kernel):
            raise InvalidInputError(f'kernel {spec!r} resolved to {type(kernel).__name__}, not a Kernel.')
        out.append(kernel)
    return out


def apply_kernels(
    model: Any, kernels: Iterable[Any], *, mode: KernelMode = 'training', device: str = 'cpu'
) -> dict[str, int]:
    """Install `kernels` into `model` for `mode` on `device` ('cpu', 'cuda', ...); returns {kernel name: modules
    replaced}. Raises `InvalidInputError` -- before changing anything -- for an unknown mode, a kernel that is not
    available on `device`, two kernels for one layer, or a kernel that would replace no module."""
    if mode not in MODES:
        raise InvalidInputError(f'kernel mode must be one of {MODES}, got {mode!r}.')
    device = str(device).split(':')[0]
    resolved = resolve_kernels(kernels)
    for k in resolved:
        if not k.is_available(device):
            raise InvalidInputError(f'kernel {k.name!r} does not run on {device!r} models.')
    layers = [k for k in resolved if isinstance(k, LayerKernel)]
    counts = _apply_layer_kernels(model, layers, mode, device) if layers else {}
    for k in resolved:
        if not isinstance(k, LayerKernel):
            counts[k.name] = k.apply(model, mode=mode, device=device)
            if counts[k.name] == 0:
                raise InvalidInputError(f'kernel {k.name!r} replaced nothing in {type(model).__name__}.')
    if counts:
        logger.info('kernels (%s, %s): %s', mode, device, ', '.join(f'{n} replaced {c}' for n, c in counts.items()))
    return counts


def _apply_layer_kernels(model: Any, layers: list[LayerKernel], mode: str, device: str) -> dict[str, int]:
    kernels_lib = kernels_library()
    by_layer: dict[str, LayerKernel] = {}
    for k in layers:
        if k.replaces in by_layer:
            raise InvalidInputError(
                f'kernels {by_layer[k.replaces].name!r} and {k.name!r} both replace layer {k.replaces!r}; ask for one.'
            )
        by_layer[k.replaces] = k
    expected = {k.name: sum(1 for _ in _modules_of(model, k)) for k in layers}
    empty = [name for name, n in expected.items() if n == 0]
    if empty:
        tagged = sorted({n for m in model.modules() if (n := getattr(type(m), 'kernel_layer_name', None)) is not None})
        wanted = '; '.join(
            f'{k.name}: layer {k.replaces!r}' + (f' or classes {list(k.decorates)}' if k.decorates else '')
            for k in layers
            if k.name in empty
        )
        raise InvalidInputError(
            f'kernel(s) {empty} would replace no module of {type(model).__name__} ({wanted}). '
            f'Layers this model tags: {", ".join(tagged) or "none"}.'
        )
    for k in layers:
        for module in _modules_of(model, k):
            if getattr(type(module), 'kernel_layer_name', None) is None:
                kernels_lib.replace_kernel_forward_from_hub(type(module), k.replaces)
    mapping = {k.replaces: {device: k.repository} for k in layers}
    kernel_mode = kernels_lib.Mode.TRAINING if mode == 'training' else kernels_lib.Mode.INFERENCE
    with _quiet(), kernels_lib.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels_lib.kernelize(model, mode=kernel_mode, device=device, use_fallback=True)
    counts = {k.name: sum(1 for m in _modules_of(model, k) if _forward_of(m) is k.layer.forward) for k in layers}
    short = {n: (counts[n], expected[n]) for n in counts if counts[n] != expected[n]}
    if short:
        raise TwinkleError(
            f'kernelize replaced fewer modules than tagged ({{name: (replaced, tagged)}}: {short}); '
            f'the kernel may not support mode {mode!r} (see the kernels library log).'
        )
    return counts


def _modules_of(model: Any, kernel: LayerKernel) -> Iterator[Any]:
    """Modules `kernel` replaces: tagged with its layer name, or of a class it decorates."""
    for module in model.modules():
        cls = type(module)
        if getattr(cls, 'kernel_layer_name', None) == kernel.replaces or (
            cls.__name__ in kernel.decorates and getattr(cls, 'kernel_layer_name', None) is None
        ):
            yield module


def _forward_of(module: Any) -> Any:
    forward = module.__dict__.get('forward')
    return getattr(forward, '__func__', None)


def kernels_library() -> Any:
    try:
        import kernels
    except ImportError as exc:
        raise TwinkleError(
            f'Layer kernels need the Hugging Face `kernels` library ({exc}). Run: pip install "twinkle-core[kernels]"'
        ) from exc
    return kernels


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """kernelize logs a warning for every tagged module outside the mapping (they keep their forward)."""
    log = logging.getLogger('kernels')
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
