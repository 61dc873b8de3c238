#!/usr/bin/env bash
# Set up .venv (if needed) and run the main job: LoRA SFT of the tiny local Qwen3 model on the
# self-cognition data, then ask it "who are you?". Extra arguments go to examples/sft_lora.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh quickstart
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python examples/sft_lora.py "$@"
