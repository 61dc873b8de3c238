# Sourced by the GPU scripts (gpu_checks.sh, gpu_bench.sh) on a bare CUDA machine (e.g. the lent device): installs
# the wheels put in .whl/ (pydantic, kernels, liger-kernel, megatron-core, ...; that machine has no registry) into
# /tmp/site, and this checkout's packages in editable mode, without touching the machine's torch.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . -e plugins/transformers -e plugins/megatron \
  2>&1 | tail -2
nvidia-smi -L
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
