#!/usr/bin/env bash
# A real Prometheus (Debian package) scraping a real proxy + 2 simulated workers under a
# shared-prefix load (8 tenants), evaluating deploy/prometheus/rules at a 5 s interval; prints the
# recorded series and ALERTS. Needs `prometheus` on PATH and port 19090 free. Usage:
#   bash deploy/prometheus/try_rules.sh        (POLICY=cache_aware LOAD_S=60 to vary)
# Bounded: LOAD_S seconds (default 90) and 3000 requests at most.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
ready() { for _ in $(seq 1 200); do grep -m1 '^READY' "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
ws=()
for i in 0 1; do
  .venv/bin/python -m proxy.sim --port 0 --profile llama-3.1-8b-h100 --time-scale 20 --max-total-tokens 40000 --enable-metrics --enable-cache-report > $W/w$i.log 2>&1 & pids+=($!)
  ws+=(--worker "$(ready $W/w$i.log | awk '{print $2}')")
done
.venv/bin/python -m proxy serve --port 0 --admin-port 0 --policy ${POLICY:-round_robin} "${ws[@]}" > $W/proxy.log 2>&1 & pids+=($!)
line=$(ready $W/proxy.log); http=$(sed -E 's/.*http=[^ ]*:([0-9]+).*/\1/' <<<"$line"); admin=$(sed -E 's/.*admin=[^ ]*:([0-9]+).*/\1/' <<<"$line")
sed "s/radixgate:8001/127.0.0.1:$admin/; s/names: \[\"worker\"\]/names: [\"localhost\"]/" deploy/prometheus/prometheus.yml | sed 's/scrape_interval: 5s/scrape_interval: 2s/' > $W/prom.yml
# recording groups evaluate every 30 s; use a copy of the rules at 5 s for a quick look
mkdir -p $W/rules; for f in deploy/prometheus/rules/*.yaml; do sed 's/interval: 30s/interval: 5s/' $f > $W/rules/$(basename $f); done
sed -i "s#/etc/prometheus/rules/\*.yaml#$W/rules/*.yaml#" $W/prom.yml
prometheus --config.file=$W/prom.yml --storage.tsdb.path=$W/data --web.listen-address=127.0.0.1:19090 > $W/prom.log 2>&1 & pids+=($!)
end=$((SECONDS+${LOAD_S:-90})); n=0
while [ $SECONDS -lt $end ] && [ $n -lt 3000 ]; do
  for g in 0 1 2 3 4 5 6 7; do
    prefix=$(printf 'System prompt for tenant %d. %.0s' $g $(seq 1 60))
    curl -sf "http://127.0.0.1:$http/generate" -H 'content-type: application/json' \
      -d "{\"text\": \"$prefix Question $n\", \"sampling_params\": {\"max_new_tokens\": 16}, \"stream\": true}" >/dev/null &
    n=$((n+1))
  done
  wait $(jobs -p | grep -v -E "^($(IFS='|'; echo "${pids[*]}"))$") 2>/dev/null || true
done
echo "requests sent: $n"
sleep 12  # one more rule evaluation after the last scrape
for q in 'fleet:radixgate_ttft_seconds:p50_5m' 'fleet:radixgate_ttft_seconds:p95_5m' 'fleet:radixgate_upstream_ttft_seconds:p95_5m' \
         'fleet:radixgate_admission_wait_seconds:p95_5m' 'fleet:radixgate_inter_token_latency_seconds:p95_5m' \
         'fleet:radixgate_cache_hit_ratio:captured_5m' 'fleet:radixgate_cache_hit_ratio:available_5m' \
         'worker:radixgate_worker_occupancy_ratio:avg' 'fleet:radixgate_requests_accepted:rate5m' \
         'fleet:radixgate_diagnosis_verdict:max == 1' 'ALERTS'; do
  printf '%-55s ' "$q"; curl -s "http://127.0.0.1:19090/api/v1/query" --data-urlencode "query=$q" | python3 -c '
import json,sys; r=json.load(sys.stdin)["data"]["result"]
print("; ".join(("{"+",".join(f"{k}={v}" for k,v in x["metric"].items() if k!="__name__")+"} " if len(x["metric"])>1 or "__name__" not in x["metric"] else "")+str(round(float(x["value"][1]),4)) for x in r) or "(no data)")'
done
