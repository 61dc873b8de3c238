#!/usr/bin/env bash
# The GPU checks, run on a CUDA machine (e.g. through the lent device): the `gpu`-marked tests and the GPU
# benchmarks. Usage: scripts/gpu_checks.sh [kernels] [megatron]   (no argument: both).
# Wheels missing on that machine may be put in .whl/ first (pydantic, kernels, liger-kernel, megatron-core, ...);
# they are installed into /tmp/site. Logs go to ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
sections=${*:-kernels megatron}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . -e plugins/transformers -e plugins/megatron \
  2>&1 | tail -2
nvidia-smi -L
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
pytest_gpu() { python3 -m pytest -q -p no:cacheprovider -m gpu -o addopts="" "$@"; }
for section in $sections; do
  case $section in
    kernels)
      pytest_gpu tests/core/test_kernels.py tests/transformers 2>&1 | tee "$out/gpu_tests_kernels.log"
      python3 bench/sft_kernels.py --model small --rounds 3 2>&1 | tee "$out/bench_kernels_gpu.log" ;;
    megatron)
      pytest_gpu tests/megatron 2>&1 | tee "$out/gpu_tests_megatron.log"
      python3 bench/megatron_backend.py --gpu --model medium --batch-size 32 2>&1 | tee "$out/bench_megatron_gpu.log"
      python3 bench/megatron_backend.py --gpu --model medium --batch-size 32 --lora 2>&1 \
        | tee "$out/bench_megatron_lora_gpu.log" ;;
    *) echo "unknown section $section (kernels, megatron)"; exit 2 ;;
  esac
done
