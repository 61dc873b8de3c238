# Ported from the Twinkle Qwen3.5 best-practices guide, section "GRPO in Ray mode" (model training and vLLM sampling
# in separate device groups, coordinated through Ray). Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - hub ids -> local ones: 'ms://Qwen/Qwen3.5-4B' -> a local model dir (TWINKLE_SEED_MODEL, default: the tiny Qwen3
#   fixture), 'ms://modelscope/gsm8k' -> the project's GSM8K sample file (TWINKLE_SEED_GSM8K, default: the fixture's);
# - GPU counts -> CPU ranks: MODEL_GPUS = SAMPLER_GPUS = 4 -> 1 each, device_type='GPU' -> 'CPU';
# - sizes for 2 cores: NUM_GENERATIONS 8 -> 4, MAX_NEW_TOKENS 4096 -> 24, MAX_STEPS 200 -> 4, BATCH_SIZE 16 -> 2,
#   MINI_BATCH_SIZE 16 -> 8, max_model_len 4096 -> 2048 (the fixture's context).
# The fixture has random weights: rewards stay near zero, so this shows the loop running end to end, not learning
# (examples/grpo.py learns a real task on the native sampler).
# Launch: python examples/seeds/ray_grpo_vllm.py   (local Ray; needs twinkle-vllm)
import os
from typing import Any

from peft import LoraConfig

import twinkle_core as twinkle
from twinkle_core import DeviceGroup, DeviceMesh, get_device_placement, get_logger
from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.checkpoint_engine import CheckpointEngineManager
from twinkle_core.data_format import SamplingParams
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.metric import CompletionRewardMetric
from twinkle_core.model import TransformersModel
from twinkle_core.preprocessor.llm import GSM8KProcessor
from twinkle_core.processor import InputProcessor
from twinkle_core.reward import GSM8KAccuracyReward, GSM8KFormatReward
from twinkle_core.sampler import vLLMSampler

logger = get_logger()

MODEL_ID = os.environ.get('TWINKLE_SEED_MODEL') or str(
    __import__('twinkle_core.fixtures.tiny_model', fromlist=['ensure_tiny_model']).ensure_tiny_model('tiny')
)
GSM8K = os.environ.get('TWINKLE_SEED_GSM8K') or str(
    __import__('twinkle_core.fixtures', fromlist=['data_path']).data_path('gsm8k_sample.jsonl')
)
MODEL_GPUS = 1  # 1 CPU rank for model training
SAMPLER_GPUS = 1  # 1 CPU rank for vLLM sampling
NUM_GPUS = MODEL_GPUS + SAMPLER_GPUS

NUM_GENERATIONS = 4  # 4 samples per group
MAX_NEW_TOKENS = 24
LEARNING_RATE = 1e-5
MAX_STEPS = 4
BATCH_SIZE = 2
MINI_BATCH_SIZE = 8
MICRO_BATCH_SIZE = 2
ADAPTER_NAME = 'default'


def create_gsm8k_dataset():
    dataset = Dataset(DatasetMeta(GSM8K, subset_name='main', split='train'))
    dataset.set_template('Qwen3_5Template', model_id=MODEL_ID, max_length=2048)
    dataset.map(GSM8KProcessor())
    dataset.encode(add_generation_prompt=True)
    return dataset


def compute_rewards(trajectories: list[dict[str, Any]]):
    accuracy_reward_fn = GSM8KAccuracyReward()
    format_reward_fn = GSM8KFormatReward()
    accuracy_rewards = accuracy_reward_fn(trajectories)
    format_rewards = format_reward_fn(trajectories)
    total_rewards = [a + f for a, f in zip(accuracy_rewards, format_rewards)]
    return total_rewards, format_rewards, accuracy_rewards


def main():
    # Assign model and sampler to separate CPU groups
    device_groups = [
        DeviceGroup(name='model', ranks=list(range(MODEL_GPUS)), device_type='CPU'),
        DeviceGroup(name='sampler', ranks=list(range(MODEL_GPUS, NUM_GPUS)), device_type='CPU'),
    ]
    model_mesh = DeviceMesh.from_sizes(world_size=MODEL_GPUS, dp_size=MODEL_GPUS)
    sampler_mesh = DeviceMesh.from_sizes(world_size=SAMPLER_GPUS, dp_size=SAMPLER_GPUS)

    # Initialize in Ray mode
    twinkle.initialize(mode='ray', nproc_per_node=NUM_GPUS, groups=device_groups, lazy_collect=False)

    lora_config = LoraConfig(target_modules='all-linear', r=32, lora_alpha=64, lora_dropout=0.05)

    # Model deployed in the 'model' group
    model = TransformersModel(model_id=MODEL_ID, device_mesh=model_mesh, remote_group='model')
    model.add_adapter_to_model(ADAPTER_NAME, lora_config, gradient_accumulation_steps=1)
    model.set_optimizer('AdamW', lr=LEARNING_RATE)
    model.set_lr_scheduler('CosineAnnealingLR', T_max=MAX_STEPS, eta_min=0)
    model.set_loss('GRPOLoss', epsilon=0.2)
    model.set_processor(InputProcessor)
    model.set_template('Qwen3_5Template', model_id=MODEL_ID)

    # Sampler deployed in the 'sampler' group
    sampler = vLLMSampler(
        model_id=MODEL_ID,
        engine_args={
            'gpu_memory_utilization': 0.8,
            'max_model_len': 2048,
            'max_lora_rank': 32,
            'enable_lora': False,
        },
        device_mesh=sampler_mesh,
        remote_group='sampler',
    )
    sampler.set_template('Qwen3_5Template', model_id=MODEL_ID)

    ckpt_manager = CheckpointEngineManager(model=model, sampler=sampler)

    dataloader = DataLoader(
        dataset=create_gsm8k_dataset,
        batch_size=BATCH_SIZE,
        min_batch_size=BATCH_SIZE,
        device_mesh=model_mesh,
        remote_group='model',
    )

    advantage_fn = GRPOAdvantage()
    metrics = CompletionRewardMetric()
    sampling_params = SamplingParams(max_tokens=MAX_NEW_TOKENS, num_samples=1, logprobs=1)

    optim_step = 0
    logger.info(get_device_placement())

    for batch in dataloader:
        if optim_step >= MAX_STEPS:
            break
        metrics.reset()
        global_prompts = batch if isinstance(batch, list) else [batch]

        # Sync weights to sampler
        ckpt_manager.sync_weights(merge_and_sync=True)
        sampler.reset_prefix_cache()

        # Group sampling: sample NUM_GENERATIONS completions per prompt
        sample_responses = sampler.sample(
            global_prompts * NUM_GENERATIONS,
            sampling_params,
        )

        all_input_data = []
        all_old_logps = []
        all_completion_lengths = []

        for sample_response in sample_responses:
            for sequence in sample_response.sequences:
                all_input_data.append(sequence.new_input_feature)
                all_old_logps.append([logprob[0][1] for logprob in sequence.logprobs])
                all_completion_lengths.append(len(sequence.tokens))

        # Compute rewards
        total_rewards, format_rewards, accuracy_rewards = compute_rewards(all_input_data)
        metrics.accumulate(
            completion_lengths=all_completion_lengths,
            rewards={
                'total': total_rewards,
                'format': format_rewards,
                'accuracy': accuracy_rewards,
            },
        )

        # GRPO advantage estimation: group-level normalization
        advantages = advantage_fn(total_rewards, num_generations=NUM_GENERATIONS, scale='group').tolist()

        # Mini-batch training
        total_completions = len(all_input_data)
        for mb_start in range(0, total_completions, MINI_BATCH_SIZE):
            mb_end = min(mb_start + MINI_BATCH_SIZE, total_completions)
            mb_inputs = all_input_data[mb_start:mb_end]
            mb_old_logps = all_old_logps[mb_start:mb_end]
            mb_advantages = advantages[mb_start:mb_end]

            model.forward_backward(
                inputs=mb_inputs,
                old_logps=mb_old_logps,
                advantages=mb_advantages,
                micro_batch_size=MICRO_BATCH_SIZE,
            )
            model.clip_grad_and_step()
            optim_step += 1

            if optim_step >= MAX_STEPS:
                break
            log_dict = metrics.calculate()
            log_dict.update(model.calculate_metric(is_training=True))
            metrics.reset()
            logger.info(f'[Step {optim_step}/{MAX_STEPS}] {log_dict}')

    logger.info(f'Training completed. optim_steps={optim_step}')
    model.save('grpo-gsm8k-checkpoint')


if __name__ == '__main__':
    main()
