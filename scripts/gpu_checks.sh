#!/usr/bin/env bash
# The GPU checks, run on a CUDA machine (e.g. through the lent device): the `gpu`-marked tests and the kernels
# benchmark. Wheels missing on that machine may be put in .whl/ first (pydantic, kernels, liger-kernel, ...);
# they are installed into /tmp/site. Logs go to ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . -e plugins/transformers 2>&1 | tail -2
nvidia-smi -L
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider -m gpu -o addopts="" tests/core/test_kernels.py tests/transformers \
  2>&1 | tee "$out/gpu_tests.log"
python3 bench/sft_kernels.py --model small --rounds 3 2>&1 | tee "$out/bench_kernels_gpu.log"
