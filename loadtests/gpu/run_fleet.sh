#!/usr/bin/env bash
# On the GPU machine (device tool): N real engine processes on one H200 (KV pools below the working
# set, the BPE tokenizer of loadtests/gpu/tokenizer), then the fleet benchmark's cells.
#   bash loadtests/gpu/run_fleet.sh calibrate   oracle rate ladder (the knee), one worker alone
#                                               (shared and unique prompts), baselines at the knee
#   bash loadtests/gpu/run_fleet.sh compare     every router at the knee and past it, per cell
#   CELLS="text:minimal:oracle,ttft,smg ids:full" RATES=3,4.5 bash loadtests/gpu/run_fleet.sh compare
#   LADDER=3,4.5,6 ONE_RATES=1,2,3,4 UNIQUE_RATES=1,2,3 ROUTERS=none bash loadtests/gpu/run_fleet.sh calibrate
#   GPUS=4 bash loadtests/gpu/run_fleet.sh calibrate   (nvidia-h200-x4: one engine per GPU)
#   ALONE="6:shared:200:1,2,3,4 11:unique:300:2" bash loadtests/gpu/run_fleet.sh alone   (one engine alone only)
# Engines start detached (setsid) and are reused by a later call while the machine stays warm.
# Results go to $OUT (requests.jsonl, summary.jsonl, logs).
set -uo pipefail
T_START=$(date +%s)
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/radixgate-fleet}
N=${N:-4}
KV=${KV:-48000}
PHASE_S=${PHASE_S:-20}
ENGINE_LOGS=/tmp/fleet-engines
mkdir -p "$OUT" "$ENGINE_LOGS"
up() { python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$1" 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
# The same engine's step time differed 1.7x between two machines on the same arrivals (runs 39 and
# 57): the host's CPU and the GPU's clocks and neighbours go with every result.
{ nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu \
    --format=csv; grep -m1 "model name" /proc/cpuinfo; echo "cpus $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  # the engine's shape beside its GPU (runs 73-78: 16 layers on an H100): what a replay's profile must match
  echo "engines $N, ENGINE_ARGS=${ENGINE_ARGS:-}"; } >> "$OUT/gpu.txt" 2>&1
# And once a second while it runs (in logs.tgz, on the batch logs' clock): SM clock, GPU load, steal.
python3 loadtests/gpu/sample_host.py --out "$ENGINE_LOGS/host-$T_START.csv" --max-s 600 > /dev/null 2>&1 &
SAMPLER=$!
# DP=2: every 2 engines behind one dp_front.py, as one worker of 2 data-parallel ranks (SGLang
# --dp-size 2); the routers' workers are the fronts. DP_EVENTS=1: engine r of front f publishes its KV
# events on tcp port 34000 + 10f + r (replay 35000 + 10f + r), SGLang's per-rank offset.
# FRESH_ENGINES=1: engines a warm machine kept are stopped first (their args were another call's).
DP=${DP:-1}
if [ -n "${FRESH_ENGINES:-}" ]; then pkill -f loadtests/gpu/engine_server.py; sleep 5; fi
pkill -f loadtests/gpu/dp_front.py
URLS=()
declare -A PIDS=()
for i in $(seq 1 "$N"); do
  port=$((31000 + i))
  URLS+=("http://127.0.0.1:$port")
  if ! up "http://127.0.0.1:$port"; then
    # GPUS=4 on a machine of 4 GPUs: engine i alone on GPU i-1 (one engine per GPU); unset: all on one GPU.
    gpu_env=()
    [ -n "${GPUS:-}" ] && gpu_env=(env CUDA_VISIBLE_DEVICES=$(( (i - 1) % GPUS )))
    rank_args=()
    if [ -n "${DP_EVENTS:-}" ]; then
      f=$(( (i - 1) / DP )); r=$(( (i - 1) % DP ))
      rank_args=(--dp-rank $r --kv-events-config \
        "{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$((34000 + 10 * f + r))\",\"replay_endpoint\":\"tcp://*:$((35000 + 10 * f + r))\"}")
    fi
    setsid nohup "${gpu_env[@]}" python3 loadtests/gpu/engine_server.py --port $port --tokenizer loadtests/gpu/tokenizer \
      --kv-tokens "$KV" --mem-fraction 0.15 "${rank_args[@]}" ${ENGINE_ARGS:-} > "$ENGINE_LOGS/engine_$port.log" 2>&1 < /dev/null &
    PIDS[$port]=$!
  fi
done
t0=$(date +%s)
for i in $(seq 1 "$N"); do
  port=$((31000 + i))
  until up "http://127.0.0.1:$port"; do
    # an engine that died at start (a bad ENGINE_ARGS) ends the call now, not after 240 s
    if [ -n "${PIDS[$port]:-}" ] && ! kill -0 "${PIDS[$port]}" 2>/dev/null; then
      echo "engine $port exited"; tail -30 "$ENGINE_LOGS/engine_$port.log"; exit 1
    fi
    if (( $(date +%s) - t0 > 240 )); then echo "engine $port not up"; tail -30 "$ENGINE_LOGS/engine_$port.log"; exit 1; fi
    sleep 1
  done
done
echo "engines up after $(( $(date +%s) - t0 )) s"
grep -h "READY\|Paged cache" "$ENGINE_LOGS"/*.log | head -8
WORKERS=("${URLS[@]}")
F=(python3 -m loadtests.gpu.fleet --out "$OUT" --phase-s "$PHASE_S" --drain-s 15 --seed "${SEED:-1}" ${FLEET_ARGS:-})
if (( DP > 1 )); then
  WORKERS=()
  for f in $(seq 0 $(( N / DP - 1 ))); do
    port=$((32001 + f))
    setsid nohup python3 loadtests/gpu/dp_front.py --port $port --ranks "${URLS[@]:$((f * DP)):$DP}" \
      > "$ENGINE_LOGS/front_$port.log" 2>&1 < /dev/null &
    WORKERS+=("http://127.0.0.1:$port")
  done
  for w in "${WORKERS[@]}"; do
    for _ in $(seq 60); do up "$w" && break; sleep 0.5; done
    up "$w" || { echo "DP front $w not up"; cat "$ENGINE_LOGS"/front_*.log; exit 1; }
  done
  echo "DP fronts: ${WORKERS[*]} ($DP ranks each)"
  F+=(--engine-urls "${URLS[@]}")
fi
# BUDGET_S (from the script's start) bounds every fleet run: a run past it is ended by SIGTERM and
# writes what it measured, so the fidelity replay and the archive below still run (a device call
# returns at most 8 files; an outer `timeout` would kill the script before it packs them).
fleet() {
  local left=$(( ${BUDGET_S:-520} - ($(date +%s) - T_START) ))
  if (( left < 30 )); then echo "skipped (BUDGET_S spent): $*"; return 0; fi
  timeout -s TERM "$left" "${F[@]}" "$@"
}

case "${1:-calibrate}" in
  calibrate)
    fleet --workers "${URLS[@]}" --routers oracle --rates "${LADDER:-3,6,10,15}" --warmup-s 15 --phase-base 100
    fleet --workers "${URLS[0]}" --routers direct0 --rates "${ONE_RATES:-1,2,4}" --phase-s "${ONE_PHASE_S:-15}" \
      --warmup-s 0 --phase-base 200
    fleet --workers "${URLS[0]}" --routers direct0 --rates "${UNIQUE_RATES:-1,2}" --phase-s "${ONE_PHASE_S:-15}" \
      --workload unique --warmup-s 0 --phase-base 300
    RATES=$(python3 -m loadtests.gpu.fleet --knee "$OUT/summary.jsonl")
    echo "knee,past = $RATES"
    # ROUTERS=none: the simulator's calibration points only (oracle ladder, one engine alone)
    if [ "${ROUTERS:-}" != none ]; then
      fleet --workers "${URLS[@]}" --routers "${ROUTERS:-ttft,cache_aware,smg,round_robin}" --rates "$RATES" \
        --warmup-s 0 --phase-base 400
    fi
    ;;
  alone)
    # One engine alone on the GPU, no proxy: the simulator's lone-engine points, nothing else.
    # ALONE="seed:workload:base:rates[:repeat] ...": a base one below calibrate's repeats its phases exactly
    # (6:shared:200:1,2,3,4 = gpu-fleet-calibrate-2's phases 201-204; 6:unique:301:2,3 = its 302-303);
    # repeat: each rate's trace that many rounds. WARMUP_S: a warm-up at the first rate before them
    # (warmup.jsonl: the machine's speed, fit_steps.lone_overhead), so the first rate is the loaded one.
    for spec in ${ALONE:-6:shared:200:1,2,3,4}; do
      IFS=: read -r seed workload base rates repeat <<< "$spec"
      fleet --workers "${URLS[0]}" --routers direct0 --rates "$rates" --phase-s "${ONE_PHASE_S:-20}" \
        --warmup-s "${WARMUP_S:-0}" --phase-base "$base" --workload "$workload" --seed "$seed" ${repeat:+--repeat "$repeat"}
    done
    ;;
  compare)
    # CELLS: "prompts:reports[:routers]" entries, e.g. "text:minimal:oracle,ttft,smg ids:full".
    RATES=${RATES:-$(python3 -m loadtests.gpu.fleet --knee "${KNEE_FROM:-loadtests/results/gpu-fleet/summary.jsonl}")}
    base=${PHASE_BASE:-500}
    # CELLS entries may end with ":RATES" (e.g. ids:minimal:oracle,ttft:4.5) to override RATES, and
    # then ":SEED" to override SEED (several traces in one call: ids:minimal:ttft,smg:4.5:27), and
    # then ":WORKLOAD" (shared or unique: ids:full:oracle:2,3:126:unique).
    for cell in ${CELLS:-text:minimal}; do
      IFS=: read -r prompts reports routers rates seed workload <<< "$cell"
      fleet --workers "${WORKERS[@]}" --routers "${routers:-${ROUTERS:-oracle,ttft,smg,cache_aware,round_robin}}" \
        --rates "${rates:-$RATES}" --prompts "$prompts" --reports "$reports" --warmup-s "${WARMUP_S:-10}" --phase-base $base \
        ${seed:+--seed "$seed"} ${workload:+--workload "$workload"}
      base=$((base + 100))
    done
    ;;
esac
tail -3 "$ENGINE_LOGS"/engine_31001.log
# The simulator replayed on this run's fixed-placement phases (oracle, one engine alone), while the
# day's engine is the one it is compared with: seconds of CPU, the table beside the results.
# The profile of this card and engine shape (the 16-layer engine on an H100, the whole 7B on an
# H200); and every round replayed where it went, as fitted and on the fixed cost the warm-up read
# before any judged phase (held out: a lone engine from its warm-up's steps, the fleet from its
# warm-up replayed to its step clock: over fourteen fleet runs 77 of 105 rounds, the profile as
# fitted 76; the warm-up's busy windows misread small steps, proxy/sim/README.md), and each round
# on the phase just before it (a machine drifting within the call: lone 42 of 51, fleet 77 of 105).
case "$(head -2 "$OUT/gpu.txt") ${ENGINE_ARGS:-}" in
  *H100*--layers\ 16*) PROFILE=h100-transformers-16l-dense-fit ;;
  *H100*) PROFILE=h100-transformers-7b-dense ;;
  *) PROFILE=h200-transformers-7b-dense ;;
esac
{ python3 -m loadtests.fidelity --profile "$PROFILE" --results "$OUT"
  for how in "" "--calibrate --calibrate-by warmup-steps" "--calibrate --calibrate-by previous"; do
    echo; echo "fidelity_placed --profile $PROFILE $how"
    python3 -m loadtests.fidelity_placed --profile "$PROFILE" --results "$OUT" $how
  done; } > "$OUT/fidelity.md" 2>&1 || echo "fidelity replay failed (see fidelity.md)"
kill "$SAMPLER" 2>/dev/null
# At most 8 files come back from the device: router configs and logs, engine logs in one archive
# (nullglob: a run of one engine alone has no router files, and tar's exit 2 on the missing names
# was the call's).
(cd "$OUT" && shopt -s nullglob && tar czf logs.tgz router-*.log radixgate-*.yaml -C "$ENGINE_LOGS" . \
  && rm -f router-*.log radixgate-*.yaml)
