#!/usr/bin/env bash
# The one prepared run for a lent GPU machine (no setup: it uses that machine's python3 with torch, Triton and
# transformers). Each part has its own time limit, so one that hangs or fails costs only its share:
#   1. the Triton kernel tests, compiled for CUDA instead of interpreted (tests/kernels picks CUDA when present),
#      and the CUDA-graph step's token test (tests/engine/test_compiled_decode.py)
#   2. benchmarks/gpu.py: greedy-token check of the CUDA engine, batch-1 decode, throughput, int4 (vs HF, same run)
#   3. benchmarks/gpu.py --sections graphs: the decode step as CUDA graphs (tokens vs eager, batch-1 decode)
#   4. benchmarks/attention.py --sections gpu: the Triton kernels against PyTorch's flash SDPA
# Everything lands in $OUT (default gpu-out/); `python benchmarks/gpu.py --report gpu-out/gpu.json` then writes
# benchmarks/results/gpu.{json,md} here. The limits add up to 470 s, under the 8 minutes a run is given, so a
# second run fits the session's device time. Usage: OUT=dir bash scripts/gpu_check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
QUICK=${1:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CINQ_NATIVE_KERNELS=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; $PY -c \
  "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"; } \
  2>&1 | tee "$OUT/environment.txt"
part() {  # NAME SECONDS CMD...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "=== $name (limit $limit s)"
  timeout "$limit" "$@"
  echo "=== $name: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/parts.txt"
}
part gpu-check 60 $PY benchmarks/gpu.py --out "$OUT" --sections check $QUICK
part triton-tests 110 $PY -m pytest -q -p no:cacheprovider --timeout 60 -o addopts="" -m "not slow" --tb=line -rf \
  tests/kernels/test_triton_decode.py tests/kernels/test_triton_prefill.py tests/kernels/test_triton_kv_write.py \
  tests/kernels/test_int4_gemm.py tests/kernels/test_tree_attention.py tests/kernels/test_backends.py \
  tests/kernels/test_flash.py tests/engine/test_compiled_decode.py -k "not native and (not test_compiled_decode or cuda)"
part gpu-decode 55 $PY benchmarks/gpu.py --out "$OUT" --sections decode $QUICK
part gpu-graphs 55 $PY benchmarks/gpu.py --out "$OUT" --sections graphs --models llama-1b --skip-hf-decode $QUICK
part gpu-throughput 75 $PY benchmarks/gpu.py --out "$OUT" --sections throughput --num-requests 128 \
  --hf-batch-sizes 128 $QUICK
part gpu-int4 60 $PY benchmarks/gpu.py --out "$OUT" --sections int4 --num-requests 128 $QUICK
part attention 55 $PY benchmarks/attention.py --sections gpu  # writes benchmarks/results/attention.*
cp benchmarks/results/attention.json benchmarks/results/attention.md "$OUT/" 2>/dev/null
exit 0
