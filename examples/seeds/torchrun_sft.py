# Ported from the Twinkle "Runtime Modes" document, section "torchrun Mode", whose train() is "Same training code as
# single GPU": that section's listing (examples/seeds/single_process_sft.py) is its body here. Substitutions,
# nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - hub ids -> local ones, as in single_process_sft.py;
# - GPU counts -> CPU ranks: fsdp_size=4, dp_size=2 (8 GPUs) -> fsdp_size=2, dp_size=1 (2 CPU ranks).
# Launch: torchrun --nproc_per_node=2 examples/seeds/torchrun_sft.py
import os

import twinkle_core as twinkle
from twinkle_core import DeviceMesh
from twinkle_core.model import TransformersModel
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta

DATA = os.environ.get('TWINKLE_SEED_DATA') or str(__import__(
    'twinkle_core.fixtures', fromlist=['data_path']).data_path('self_cognition.jsonl'))
MODEL = os.environ.get('TWINKLE_SEED_MODEL') or str(__import__(
    'twinkle_core.fixtures.tiny_model', fromlist=['ensure_tiny_model']).ensure_tiny_model('tiny'))

# Construct device mesh: FSDP=2, DP=1
device_mesh = DeviceMesh.from_sizes(fsdp_size=2, dp_size=1)

# Initialize in local mode
twinkle.initialize(mode='local', global_device_mesh=device_mesh)

def train():
    # Same training code as single GPU
    dataset = Dataset(dataset_meta=DatasetMeta(DATA))
    dataset.set_template('Template', model_id=MODEL)
    dataset.encode()

    dataloader = DataLoader(dataset=dataset, batch_size=8)
    model = TransformersModel(model_id=MODEL)

    for batch in dataloader:
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()

if __name__ == '__main__':
    train()
