"""The Twinkle documents' module path for the DataLoader: ``from twinkle_core.dataloader import DataLoader``
(the one implementation is `twinkle_core.dataset.dataloader.DataLoader`)."""

from twinkle_core.dataset.dataloader import DataLoader

__all__ = ['DataLoader']
