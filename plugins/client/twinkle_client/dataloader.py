"""``twinkle_client.dataloader.DataLoader`` (the Twinkle documents' path): `twinkle_core`'s DataLoader, which
batches a server-side `twinkle_client.dataset.Dataset` like any other (its rows are built on the server once;
seeded shuffle, resumable state)."""

from twinkle_core.dataset.dataloader import DataLoader

__all__ = ['DataLoader']
