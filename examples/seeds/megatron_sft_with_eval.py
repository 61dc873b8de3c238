# The best-practices guide's SFT listing (examples/seeds/fsdp2_sft_with_eval.py, "2. Local Multi-GPU, Full Code")
# on the Megatron backend: the Twinkle README lists "pp/tp/cp finetuning" as a megatron script of this shape.
# Changes from that port, nothing else:
# - `TransformersModel` -> `MegatronModel` (the one-word backend switch; the import line likewise);
# - the mesh: fsdp_size=2 (FSDP2) -> tp_size=2 (Megatron tensor parallelism over the 2 CPU ranks);
# - the FSDP wrapping hint `model.model._no_split_modules = {...}` is dropped (Megatron does not wrap with FSDP).
# Launch: torchrun --nproc_per_node=2 examples/seeds/megatron_sft_with_eval.py
import os

from peft import LoraConfig
from tqdm import tqdm

import twinkle_core as twinkle
from twinkle_core import DeviceMesh, get_device_placement, get_logger
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.model import MegatronModel
from twinkle_core.preprocessor import SelfCognitionProcessor


def _local(env: str, default) -> str:
    return os.environ.get(env) or str(default())


DATA = _local(
    'TWINKLE_SEED_DATA',
    lambda: __import__('twinkle_core.fixtures', fromlist=['data_path']).data_path('self_cognition.jsonl'),
)
MODEL = _local(
    'TWINKLE_SEED_MODEL',
    lambda: __import__('twinkle_core.fixtures.tiny_model', fromlist=['ensure_tiny_model']).ensure_tiny_model('tiny'),
)

# Build device_mesh: tp=2, dp=1, using 2 CPU ranks in total
device_mesh = DeviceMesh.from_sizes(tp_size=2, dp_size=1)
# Use torchrun mode
twinkle.initialize(mode='local', global_device_mesh=device_mesh)

logger = get_logger()


def eval(model):
    # Validation set: 48 samples
    dataset = Dataset(dataset_meta=DatasetMeta(DATA, data_slice=range(48)))
    dataset.set_template('Qwen3_5Template', model_id=MODEL)
    dataset.map(SelfCognitionProcessor('twinkle LLM', 'ModelScope Community'))
    dataset.encode()
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    for step, batch in tqdm(enumerate(dataloader)):
        model.forward_only(inputs=batch)
        model.calculate_loss()
    metrics = model.calculate_metric(is_training=False)
    return metrics


def train():
    # Training set: 120 samples
    dataset = Dataset(dataset_meta=DatasetMeta(DATA, data_slice=range(120)))
    # Set template to prepare encoding
    dataset.set_template('Qwen3_5Template', model_id=MODEL)
    # Preprocess: replace placeholders in self-cognition data
    dataset.map(SelfCognitionProcessor('twinkle LLM', 'ModelScope Community'))
    # Encode dataset
    dataset.encode()
    # Global batch size = 2; both tensor-parallel ranks process the same 2 samples
    dataloader = DataLoader(dataset=dataset, batch_size=2)
    # Load model
    model = MegatronModel(model_id=MODEL)

    lora_config = LoraConfig(r=8, lora_alpha=32, target_modules='all-linear')

    # Add LoRA adapter named 'default'
    # Comment this out to switch to full-parameter training
    model.add_adapter_to_model('default', lora_config, gradient_accumulation_steps=2)
    # Configure optimizer for LoRA
    model.set_optimizer(optimizer_cls='AdamW', lr=1e-4)
    # Configure learning rate scheduler
    model.set_lr_scheduler(
        scheduler_cls='CosineWarmupScheduler', num_warmup_steps=5, num_training_steps=len(dataloader)
    )
    logger.info(get_device_placement())
    # Print training config
    logger.info(model.get_train_configs())
    logger.info(f'Total steps: {len(dataloader)}')
    loss_metric = 99.0
    for step, batch in enumerate(dataloader):
        # Forward + backward pass
        model.forward_backward(inputs=batch)
        # Gradient clipping + optimizer step
        model.clip_grad_and_step()
        if step % 20 == 0:
            # Print training metrics
            metric = model.calculate_metric(is_training=True)
            logger.info(f'Current is step {step} of {len(dataloader)}, metric: {metric}')
        if step > 0 and step % 40 == 0:
            # Periodic evaluation
            metrics = eval(model)
            logger.info(f'Eval metric: {metrics}')
            metrics['step'] = step
            # Save best checkpoint
            if loss_metric > float(metrics['loss']):
                model.save(f'checkpoint-{step}')
                loss_metric = float(metrics['loss'])
    model.save('last-checkpoint')


if __name__ == '__main__':
    train()
