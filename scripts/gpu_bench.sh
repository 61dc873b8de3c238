#!/usr/bin/env bash
# The GPU benchmarks in one scripted run: the MFU ladder of both backends (bench/mfu_ladder.py), TorchSampler vs
# HF generate (bench/sampler.py) and the multi-tenant LoRA grid (bench/multi_tenant.py) on the `medium` fixture,
# within GPU_BENCH_BUDGET_S seconds (default 450: each section gets what is left, the ladder first), and one JSON
# of all results: $OUT/gpu_bench.json (sections cut short keep what they finished).
#
#   bash scripts/gpu_bench.sh              # a CUDA machine (e.g. the lent device; wheels in .whl/ are installed)
#   bash scripts/gpu_bench.sh --dry-run    # CPU, tiny fixture, smallest settings: what the test-suite runs
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_bench}
mkdir -p "$out"
python=${PYTHON:-python3}
deadline=$((SECONDS + ${GPU_BENCH_BUDGET_S:-450}))
left() { echo $((deadline - SECONDS)); }
if [ "${1:-}" = "--dry-run" ]; then
  model=tiny
  ladder=(--seq-len 64 --rows 2 --accumulate 2 --warmup 1 --steps 1 --compile-backend aot_eager
          --only 'old setup,fused AdamW (default),chunked CE + compiled')
  sampler=(--batch 2 --new-tokens 8 --repeats 1)
  tenants=(--tenants 2 --shapes 1x16 --repeats 1)
else
  model=medium
  . scripts/device_setup.sh
  timeout 90 "$python" -m pytest -q -p no:cacheprovider -m gpu -o addopts="" tests/transformers/test_speed_options.py \
    2>&1 | tee "$out/gpu_tests_speed.log" | tail -3
  ladder=()
  sampler=(--batch 32 --new-tokens 128 --repeats 5)
  tenants=(--tenants 16 64 --shapes 1x64 --repeats 3)
fi
"$python" -c "from twinkle_core.fixtures.tiny_model import ensure_tiny_model as e; print(e('$model'))"
cd bench
# the ladder gets all but ~3 minutes, kept for the sampler (~60 s) and the multi-tenant grid (~110 s)
timeout $(( $(left) > 240 ? $(left) - 180 : 60 )) "$python" mfu_ladder.py --model $model "${ladder[@]}" \
  --json "$out/ladder.json" 2>&1 | grep -v -i 'warn' | tee "$out/ladder.log"
timeout $(( $(left) > 170 ? 70 : 30 )) "$python" sampler.py --model $model "${sampler[@]}" \
  --json "$out/sampler.json" 2>&1 | tee "$out/sampler.log" | tail -4
timeout $(( $(left) > 30 ? $(left) : 30 )) "$python" multi_tenant.py --grid --model $model "${tenants[@]}" \
  --json "$out/multi_tenant.json" 2>&1 | tee "$out/multi_tenant.log" | tail -6
"$python" - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
merged = {}
for name in ('ladder', 'sampler', 'multi_tenant'):
    path = os.path.join(out, f'{name}.json')
    merged[name] = json.load(open(path)) if os.path.exists(path) else {'missing': 'section did not finish'}
json.dump(merged, open(os.path.join(out, 'gpu_bench.json'), 'w'), indent=1)
print('wrote', os.path.join(out, 'gpu_bench.json'), {k: 'missing' in v for k, v in merged.items()})
PY
