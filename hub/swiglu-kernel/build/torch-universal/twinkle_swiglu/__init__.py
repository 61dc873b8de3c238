"""twinkle-swiglu: a gated MLP with a fused SiLU-and-mul (pure PyTorch, every device)."""
from . import layers

__all__ = ['layers']
