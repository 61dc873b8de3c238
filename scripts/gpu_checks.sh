#!/usr/bin/env bash
# The GPU checks, run on a CUDA machine (e.g. through the lent device): the `gpu`-marked tests and the GPU
# benchmarks. Usage: scripts/gpu_checks.sh [kernels] [megatron]   (no argument: both).
# Wheels missing on that machine may be put in .whl/ first (pydantic, kernels, liger-kernel, megatron-core, ...);
# they are installed into /tmp/site. Logs go to ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
sections=${*:-kernels megatron}
. scripts/device_setup.sh
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
