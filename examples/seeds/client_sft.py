# Ported from the Twinkle Qwen3.5 best-practices guide, section "3.1 Twinkle Client: Fine-Grained Control": LoRA
# SFT through the native client, the dataset built on the server. Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports (`twinkle_client` keeps its name);
# - hub ids -> local ones: 'ms://Qwen/Qwen3.5-4B' -> TWINKLE_SEED_BASE_MODEL (an ms:// id of the model the server
#   hosts), 'ms://swift/self-cognition' -> TWINKLE_SEED_DATA (a file in a root the server allows);
# - 'http://127.0.0.1:8000' / 'EMPTY_TOKEN' -> TWINKLE_SEED_BASE_URL / TWINKLE_SEED_API_KEY;
# - sizes for 2 cores: data_slice range(500) -> range(120) (the whole local file).
import os

import dotenv

dotenv.load_dotenv('.env')

from peft import LoraConfig

from twinkle_client import init_twinkle_client
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_core import get_logger
from twinkle_core.dataset import DatasetMeta

BASE_MODEL = os.environ['TWINKLE_SEED_BASE_MODEL']
DATA = os.environ['TWINKLE_SEED_DATA']

logger = get_logger()

# Initialize the Twinkle client
client = init_twinkle_client(base_url=os.environ['TWINKLE_SEED_BASE_URL'], api_key=os.environ['TWINKLE_SEED_API_KEY'])

# Query existing training runs and checkpoints
runs = client.list_training_runs()
resume_path = None
for run in runs:
    logger.info(run.model_dump_json(indent=2))
    checkpoints = client.list_checkpoints(run.training_run_id)
    for checkpoint in checkpoints:
        logger.info(checkpoint.model_dump_json(indent=2))
        # Uncomment to resume from a specific checkpoint:
        # resume_path = checkpoint.twinkle_path


def train():
    # Prepare dataset
    dataset = Dataset(dataset_meta=DatasetMeta(DATA, data_slice=range(120)))
    dataset.set_template('Qwen3_5Template', model_id=BASE_MODEL, max_length=512)
    dataset.map(
        'SelfCognitionProcessor', init_args={'model_name': 'twinkle model', 'model_author': 'ModelScope Community'}
    )
    dataset.encode(batched=True)
    dataloader = DataLoader(dataset=dataset, batch_size=4)

    # Configure model
    model = MultiLoraTransformersModel(model_id=BASE_MODEL)

    lora_config = LoraConfig(target_modules='all-linear')
    model.add_adapter_to_model('default', lora_config, gradient_accumulation_steps=2)
    model.set_template('Qwen3_5Template')
    model.set_processor('InputProcessor', padding_side='right')
    model.set_loss('CrossEntropyLoss')
    model.set_optimizer('AdamW', lr=1e-4)
    model.set_lr_scheduler('LinearLR')

    # Resume from checkpoint if available
    if resume_path:
        logger.info(f'Resuming training from {resume_path}')
        model.load(resume_path, load_optimizer=True)

    logger.info(model.get_train_configs())

    for epoch in range(3):
        logger.info(f'Starting epoch {epoch}')
        for step, batch in enumerate(dataloader):
            # Forward + backward
            output = model.forward_backward(inputs=batch)

            if step % 2 == 0:
                logger.info(f'Current is step {step // 2}, loss: {output}')

            model.clip_grad_norm(1.0)
            model.step()
            model.zero_grad()
            model.lr_step()

        # Save checkpoint
        twinkle_path = model.save(name=f'twinkle-epoch-{epoch}', save_optimizer=True)
        logger.info(f'Saved checkpoint: {twinkle_path}')


if __name__ == '__main__':
    train()
