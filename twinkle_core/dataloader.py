"""Serves the Twinkle documents' ``twinkle.dataloader.DataLoader`` (code: `twinkle_core.dataset.dataloader`)."""

from twinkle_core.dataset.dataloader import DataLoader

__all__ = ['DataLoader']
