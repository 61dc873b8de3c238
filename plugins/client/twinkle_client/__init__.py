"""twinkle-client: drive a twinkle server from a laptop (httpx + pydantic; no torch).

from twinkle_client import init_twinkle_client, MultiLoraTransformersModel, TorchSampler
client = init_twinkle_client(base_url='http://127.0.0.1:8000', api_key='tml-...')
model = MultiLoraTransformersModel(model_id='Qwen/Qwen3-0.6B')   # = RemoteModel: whatever backend the server runs
"""

from twinkle_client.client import TwinkleClient, init_twinkle_client
from twinkle_client.http import RemoteError, RemoteInputError
from twinkle_client.remote import MultiLoraTransformersModel, RemoteModel, RemoteSampler, TorchSampler
from twinkle_client.rollouts import AgentRun, RolloutSessions

__all__ = [
    'AgentRun',
    'MultiLoraTransformersModel',
    'RemoteError',
    'RemoteInputError',
    'RemoteModel',
    'RemoteSampler',
    'RolloutSessions',
    'TorchSampler',
    'TwinkleClient',
    'init_twinkle_client',
]
