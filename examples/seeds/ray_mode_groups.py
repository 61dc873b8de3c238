# Ported from the Twinkle "Runtime Modes" document, section "Ray Mode" (a model group and a vLLM sampler group;
# the listing's train() stops at `...` after building both). Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports, and the two imports the listing leaves out (TransformersModel,
#   vLLMSampler; its own text uses both);
# - hub ids -> local ones: 'ms://Qwen/Qwen3.5-4B' -> a local model dir (TWINKLE_SEED_MODEL, default: the tiny Qwen3
#   fixture);
# - GPU counts -> CPU ranks: ranks=4, device_type='cuda' -> ranks=1, device_type='cpu' for each group; world_size=4,
#   dp_size=4 -> 1; nproc_per_node=8 -> 2.
# Run: python examples/seeds/ray_mode_groups.py   (local Ray; needs twinkle-vllm)
import os

import twinkle_core as twinkle
from twinkle_core import DeviceGroup, DeviceMesh
from twinkle_core.model import TransformersModel
from twinkle_core.sampler import vLLMSampler

MODEL = os.environ.get('TWINKLE_SEED_MODEL') or str(
    __import__('twinkle_core.fixtures.tiny_model', fromlist=['ensure_tiny_model']).ensure_tiny_model('tiny')
)

# Define resource groups
device_groups = [
    DeviceGroup(name='model', ranks=1, device_type='cpu'),
    DeviceGroup(name='sampler', ranks=1, device_type='cpu'),
]

# Define parallel topology
model_mesh = DeviceMesh.from_sizes(world_size=1, dp_size=1)
sampler_mesh = DeviceMesh.from_sizes(world_size=1, dp_size=1)

# Initialize Ray mode
twinkle.initialize(mode='ray', nproc_per_node=2, groups=device_groups, lazy_collect=False)


def train():
    model = TransformersModel(model_id=MODEL, remote_group='model', device_mesh=model_mesh)

    sampler = vLLMSampler(model_id=MODEL, device_mesh=sampler_mesh, remote_group='sampler')
    ...


if __name__ == '__main__':
    train()
