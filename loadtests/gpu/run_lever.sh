#!/usr/bin/env bash
# On the GPU machine (device tool): the same cells on engines restarted with each engine setting in
# turn, to measure a lever a diagnosis names on a real engine (the ground truth for its verdict):
#   VARIANTS="base=;mbt16k=--max-batch-tokens 16384;base2=" FLEET_ARGS="--repeat 2" \
#     CELLS="ids:full:ttft:6" PHASE_S=25 SEED=9 PHASE_BASE=1900 bash loadtests/gpu/run_lever.sh
# VARIANTS: "name=ENGINE_ARGS" entries separated by ";", run in that order on the same trace and
# text (every other setting as run_fleet.sh reads it). Each variant's files go to NAME/ in
# $OUT/lever.tgz (a device call returns at most 8 files); VARIANT_S bounds one variant, LEVER_BUDGET_S
# the whole call.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
OUT=${OUT:-/tmp/radixgate-lever}
R=$(mktemp -d)
stop_engines() {
  pkill -f loadtests/gpu/engine_server.py
  for _ in $(seq 60); do pgrep -f loadtests/gpu/engine_server.py > /dev/null || return 0; sleep 1; done
  pkill -9 -f loadtests/gpu/engine_server.py
}
IFS=';' read -ra variants <<< "${VARIANTS:?VARIANTS=\"name=engine args;...\"}"
for v in "${variants[@]}"; do
  name=${v%%=*}; args=${v#*=}
  left=$(( ${LEVER_BUDGET_S:-540} - ($(date +%s) - T0) ))
  per=${VARIANT_S:-180}
  if (( left < 60 )); then echo "skipped $name (LEVER_BUDGET_S spent)"; continue; fi
  (( per > left )) && per=$left
  stop_engines  # engines with another variant's settings must not be reused
  echo "== $name: ENGINE_ARGS='$args' ($(( $(date +%s) - T0 )) s)"
  OUT=$R/$name ENGINE_ARGS="$args" BUDGET_S=$per bash loadtests/gpu/run_fleet.sh compare > "$R/$name.log" 2>&1
  grep -h " @ \|^|" "$R/$name.log"
done
stop_engines
mkdir -p "$OUT"
tar czf "$OUT/lever.tgz" -C "$R" .
echo "done after $(( $(date +%s) - T0 )) s"
