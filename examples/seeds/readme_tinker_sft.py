# Ported from the Twinkle README, section "Access the Serverless Training Services via Tinker-compatible API":
# a twinkle dataset encoded locally, trained through the official tinker SDK against a training service.
# Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - hub ids -> local ones: 'ms://Qwen/Qwen3.6-27B' -> TWINKLE_SEED_BASE_MODEL (an ms:// id the test publishes into
#   a local hub root, TWINKLE_HUB_ROOT, and the server serves under the same name), 'ms://swift/self-cognition' ->
#   the project's self-cognition file (TWINKLE_SEED_DATA, default: the tiny fixture's);
# - the placeholders 'your-base-url' / 'your-api-key' -> TWINKLE_SEED_BASE_URL / TWINKLE_SEED_API_KEY;
# - sizes for 2 cores: data_slice range(500) -> range(120) (the whole local file).
import os

from tinker import types
from tqdm import tqdm

from twinkle_core import init_tinker_client
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.preprocessor import SelfCognitionProcessor
from twinkle_core.server.common import input_feature_to_datum

base_model = os.environ['TWINKLE_SEED_BASE_MODEL']
base_url = os.environ['TWINKLE_SEED_BASE_URL']
api_key = os.environ['TWINKLE_SEED_API_KEY']
DATA = os.environ.get('TWINKLE_SEED_DATA') or str(
    __import__('twinkle_core.fixtures', fromlist=['data_path']).data_path('self_cognition.jsonl')
)

# Use twinkle dataset to load the data
dataset = Dataset(dataset_meta=DatasetMeta(DATA, data_slice=range(120)))
dataset.set_template('Qwen3_5Template', model_id=base_model, max_length=256)
dataset.map(SelfCognitionProcessor('twinkle Model', 'ModelScope Team'), load_from_cache_file=False)
dataset.encode(batched=True, load_from_cache_file=False)
dataloader = DataLoader(dataset=dataset, batch_size=8)

# Initialize Tinker client before importing ServiceClient
init_tinker_client()
from tinker import ServiceClient

service_client = ServiceClient(base_url=base_url, api_key=api_key)
training_client = service_client.create_lora_training_client(base_model=base_model[len('ms://') :], rank=16)

# Training loop: use input_feature_to_datum to transfer the input format
for epoch in range(3):
    for step, batch in tqdm(enumerate(dataloader)):
        input_datum = [input_feature_to_datum(input_feature) for input_feature in batch]

        fwdbwd_future = training_client.forward_backward(input_datum, 'cross_entropy')
        optim_future = training_client.optim_step(types.AdamParams(learning_rate=1e-4))

        fwdbwd_result = fwdbwd_future.result()
        optim_result = optim_future.result()

    training_client.save_state(f'twinkle-lora-{epoch}').result()
