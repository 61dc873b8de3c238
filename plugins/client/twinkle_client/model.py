"""The Twinkle documents' module path: ``from twinkle_client.model import MultiLoraTransformersModel`` (a
`RemoteModel`: the model a twinkle server hosts, whatever its backend)."""

from twinkle_client.remote import MultiLoraTransformersModel, RemoteModel

__all__ = ['MultiLoraTransformersModel', 'RemoteModel']
