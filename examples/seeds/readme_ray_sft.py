# Ported from the Twinkle README, section "Train with Ray". Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - hub ids -> local ones: 'ms://Qwen/Qwen3.6-27B' -> a local model dir (TWINKLE_SEED_MODEL, default: the tiny
#   Qwen3 fixture), 'ms://swift/self-cognition' -> the project's self-cognition file (TWINKLE_SEED_DATA, default: the
#   fixture's; its 120 rows stand for the listing's 1000);
# - GPU counts -> CPU ranks: ranks=8, device_type='cuda' -> ranks=2, device_type='cpu'; fsdp_size=4, dp_size=2 ->
#   fsdp_size=2, dp_size=1.
# Run: python examples/seeds/readme_ray_sft.py   (starts a local Ray instance)
import os

from peft import LoraConfig

import twinkle_core as twinkle
from twinkle_core import DeviceGroup, DeviceMesh
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.model import TransformersModel
from twinkle_core.preprocessor import SelfCognitionProcessor

DATA = os.environ.get('TWINKLE_SEED_DATA') or str(
    __import__('twinkle_core.fixtures', fromlist=['data_path']).data_path('self_cognition.jsonl')
)
MODEL = os.environ.get('TWINKLE_SEED_MODEL') or str(
    __import__('twinkle_core.fixtures.tiny_model', fromlist=['ensure_tiny_model']).ensure_tiny_model('tiny')
)

device_group = [DeviceGroup(name='default', ranks=2, device_type='cpu')]
device_mesh = DeviceMesh.from_sizes(fsdp_size=2, dp_size=1)
# local for torchrun
twinkle.initialize(mode='ray', groups=device_group, global_device_mesh=device_mesh)


def train():
    # to load model from Hugging Face, use 'hf://...'
    base_model = MODEL
    # 1000 samples
    dataset = Dataset(dataset_meta=DatasetMeta(DATA, data_slice=range(120)))
    # Set template to prepare encoding
    dataset.set_template('Qwen3_5Template', model_id=base_model)
    # Preprocess the dataset to standard format
    dataset.map(SelfCognitionProcessor('twinkle LLM', 'ModelScope Community'))
    # Encode dataset
    dataset.encode()
    # Global batch size = 8, for GPUs, so 1 sample per GPU
    dataloader = DataLoader(dataset=dataset, batch_size=8, min_batch_size=8)
    # Use a TransformersModel
    model = TransformersModel(model_id=base_model, remote_group='default')

    lora_config = LoraConfig(r=8, lora_alpha=32, target_modules='all-linear')

    # Add a lora to model, with name `default`
    # Comment this to use full-parameter training
    model.add_adapter_to_model('default', lora_config, gradient_accumulation_steps=2)
    # Add Optimizer for lora `default`
    model.set_optimizer(optimizer_cls='AdamW', lr=1e-4)
    # Add LRScheduler for lora `default`
    model.set_lr_scheduler(
        scheduler_cls='CosineWarmupScheduler', num_warmup_steps=5, num_training_steps=len(dataloader)
    )
    for step, batch in enumerate(dataloader):
        # Do forward and backward
        model.forward_backward(inputs=batch)
        # Step
        model.clip_grad_and_step()
        if step % 20 == 0:
            # Print metric
            metric = model.calculate_metric(is_training=True)
            print(f'Current is step {step} of {len(dataloader)}, metric: {metric}')
    model.save('last-checkpoint')


if __name__ == '__main__':
    train()
