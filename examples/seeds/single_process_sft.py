# Ported from the Twinkle "Runtime Modes" document, section "Single GPU". Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - hub ids -> local ones: 'ms://swift/self-cognition' -> the project's self-cognition file (TWINKLE_SEED_DATA,
#   default: the fixture's), 'ms://Qwen/Qwen3.5-4B' -> a local model dir (TWINKLE_SEED_MODEL, default: the tiny
#   Qwen3 fixture).
# As written, the listing encodes the raw query/response rows (no preprocessor: `encode` converts that chat layout
# with MessagesProcessor) and steps without set_optimizer (AdamW, lr 1e-5 for full-parameter training, announced by
# a warning).
# Run: python examples/seeds/single_process_sft.py
import os

from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.model import TransformersModel

DATA = os.environ.get('TWINKLE_SEED_DATA') or str(
    __import__('twinkle_core.fixtures', fromlist=['data_path']).data_path('self_cognition.jsonl')
)
MODEL = os.environ.get('TWINKLE_SEED_MODEL') or str(
    __import__('twinkle_core.fixtures.tiny_model', fromlist=['ensure_tiny_model']).ensure_tiny_model('tiny')
)


def train():
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
