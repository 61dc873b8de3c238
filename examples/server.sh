#!/usr/bin/env bash
# Start a twinkle training server on a local model directory, served under a public alias, and issue a key.
#
#   examples/server.sh [MODEL_DIR] [DATA_DIR] [PORT]
#
# MODEL_DIR defaults to the tiny fixture model (built offline on first use). Clients then use
#   base_url=http://127.0.0.1:$PORT  api_key=<printed key>  base_model=Qwen/Qwen3-0.6B
set -euo pipefail
MODEL_DIR=${1:-$(python -c 'from twinkle_core.fixtures.tiny_model import ensure_tiny_model; print(ensure_tiny_model())')}
DATA_DIR=${2:-./twinkle-server-data}
PORT=${3:-8000}

KEY=$(twinkle server keys create --tenant demo --data-dir "$DATA_DIR")
echo "API key for tenant 'demo': $KEY"
echo "export TINKER_API_KEY=$KEY TWINKLE_BASE_URL=http://127.0.0.1:$PORT"
exec twinkle server start --model "Qwen/Qwen3-0.6B=$MODEL_DIR" --data-dir "$DATA_DIR" --host 127.0.0.1 --port "$PORT"
