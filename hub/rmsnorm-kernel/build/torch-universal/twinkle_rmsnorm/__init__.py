"""twinkle-rmsnorm: RMSNorm as one `torch.nn.functional.rms_norm` call (pure PyTorch, every device)."""
from . import layers

__all__ = ['layers']
