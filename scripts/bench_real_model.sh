#!/usr/bin/env bash
# Every headline figure on the real model (smollm2-135m-instruct), each benchmark measuring its baseline in the
# same run; results in benchmarks/results/*_smollm2.{json,md,png}. Run it alone on a quiet machine (~20 min on
# 2 cores): a benchmark that shares the cores with other work is a draft.
#   bash scripts/bench_real_model.sh [latency|throughput|prefix|serve ...]   (default: all four)
set -euo pipefail
cd "$(dirname "$0")/.."
CINQ=${CINQ:-.venv/bin/cinq}
MODEL=smollm2-135m-instruct
OUT=benchmarks/results
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(latency throughput prefix serve)
for kind in "${kinds[@]}"; do
  echo "== $kind ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
  case "$kind" in
    # batch 1 on the same GGUF files in cinq and llama.cpp (bf16 / q8_0 / q4_0 exports of the dequantized file,
    # and the original Q4_1 file), HF generate on the dense folder, at 1 and 2 threads
    latency) "$CINQ" bench latency "$MODEL" --variants bf16,int8,int4,file --baselines llama.cpp,hf \
               --threads-list 1,2 --input-lens 128 --output-len 64 --num-iters 2 --no-progress \
               --out "$OUT/latency_smollm2" ;;
    throughput) "$CINQ" bench throughput "$MODEL" --num-prompts 64 --no-progress --out "$OUT/throughput_smollm2" ;;
    prefix) "$CINQ" bench prefix "$MODEL" --prefix-len 512 --num-prompts 32 --no-progress \
              --out "$OUT/prefix_smollm2" ;;
    serve) "$CINQ" bench serve "$MODEL" --request-rates 8,32,inf --num-prompts 48 --no-progress \
             --out "$OUT/serving_smollm2" ;;
    *) echo "bench_real_model: unknown kind $kind (latency, throughput, prefix, serve)" >&2; exit 2 ;;
  esac
done
