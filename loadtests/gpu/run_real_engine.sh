#!/usr/bin/env bash
# On the GPU machine (device tool): two real continuous-batching engines on one H200 behind
# radixgate, the demo's workload through the default policy and the baselines (after one warm-up
# run), diagnosis with NVML.
#   bash loadtests/gpu/run_real_engine.sh        (writes into $OUT)
#   ENGINE_ARGS=--cuda-graph COMPARE= bash loadtests/gpu/run_real_engine.sh   (the lever the verdict named)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/radixgate-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
declare -A pids
for port in 31001 31002; do
  python3 loadtests/gpu/engine_server.py --port $port --mem-fraction 0.3 ${ENGINE_ARGS:-} > "$OUT/engine_$port.log" 2>&1 &
  pids[$port]=$!
  sleep 15  # stagger start-up: the second engine sizes its KV pool from what the first left free
done
for port in 31001 31002; do
  for _ in $(seq 1 240); do
    grep -q READY "$OUT/engine_$port.log" && break
    kill -0 "${pids[$port]}" 2>/dev/null || break
    sleep 1
  done
  grep READY "$OUT/engine_$port.log" || { echo "engine $port failed"; tail -40 "$OUT/engine_$port.log"; exit 1; }
done
DEMO="python3 -m proxy demo --worker http://127.0.0.1:31001 --worker http://127.0.0.1:31002
  --groups 8 --prompts-per-group 8 --system-tokens 4096 --question-tokens 128 --output-tokens 48
  --rate ${RATE:-3} --slo-ttft-s 1.0"
# A fresh engine is slower on its first requests (kernels and allocator warming up: GPU idle 43%
# on the first run after start, 18-22% on later ones), so whichever policy ran first paid for it.
$DEMO --policy round_robin --compare --seed 99 > "$OUT/warmup.txt" 2>&1
$DEMO --save-dir "$OUT" --policy ttft --compare ${COMPARE-round_robin cache_aware} 2>&1 | tee "$OUT/demo.txt"
echo "demo exit: ${PIPESTATUS[0]}"
tail -5 "$OUT/engine_31001.log"
