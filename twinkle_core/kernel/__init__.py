"""Kind `kernel`: the interface, layer kernels (Hugging Face ``kernels`` layout, from the registry or a hub) and
`apply_kernels`, plus lazy access to every registered kernel by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.kernel.base import Kernel, KernelMode
from twinkle_core.kernel.layer import LayerKernel, apply_kernels, resolve_kernels

__all__ = ['Kernel', 'KernelMode', 'LayerKernel', 'apply_kernels', 'resolve_kernels']

__getattr__ = kind_getattr('kernel', __name__)
