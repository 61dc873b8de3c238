# Ported from the Twinkle Qwen3.5 best-practices guide, section "2. Local Multi-GPU, Full Code" (torchrun FSDP2
# LoRA SFT with periodic evaluation). Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - hub ids -> local ones: 'ms://swift/self-cognition' -> the project's self-cognition file (TWINKLE_SEED_DATA,
#   default: the tiny fixture's), 'ms://Qwen/Qwen3.5-4B' -> a local model dir (TWINKLE_SEED_MODEL, default: the
#   tiny Qwen3 fixture), the model's decoder class 'Qwen3_5DecoderLayer' -> 'Qwen3DecoderLayer';
# - GPU counts -> CPU ranks: fsdp_size=4, dp_size=2 (8 GPUs) -> fsdp_size=2, dp_size=1 (2 CPU ranks);
# - sizes for 2 cores: training slice range(1000) -> range(120) (the whole local file) with global batch 8 -> 2
#   (so the listing's every-40-steps evaluation still runs), validation range(100) -> range(48).
# Launch: torchrun --nproc_per_node=2 examples/seeds/fsdp2_sft_with_eval.py
import os

from peft import LoraConfig
from tqdm import tqdm

import twinkle_core as twinkle
from twinkle_core import DeviceMesh, get_device_placement, get_logger
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.model import TransformersModel
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

# Build device_mesh: fsdp=2, dp=1, using 2 CPU ranks in total
device_mesh = DeviceMesh.from_sizes(fsdp_size=2, dp_size=1)
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
    # Global batch size = 2; each of the 2 ranks processes 1 sample
    dataloader = DataLoader(dataset=dataset, batch_size=2)
    # Load model
    model = TransformersModel(model_id=MODEL)
    model.model._no_split_modules = {'Qwen3DecoderLayer'}

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
