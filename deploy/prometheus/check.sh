#!/usr/bin/env bash
# Check the Prometheus artifacts with promtool (Debian: apt-get install -y prometheus):
#   config and rule syntax, the alert unit tests, and `promtool check metrics` on a real scrape of
#   a running proxy in front of two simulated workers (after a few requests, so every labelled
#   family has samples).
#
#   bash deploy/prometheus/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
command -v promtool >/dev/null || { echo "promtool not found (apt-get install -y prometheus)" >&2; exit 2; }

promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/rules/*.yaml
promtool test rules deploy/prometheus/tests/alerts_test.yaml

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

ready_url() {  # wait (bounded) for the "READY ..." line a process prints, then echo it
  for _ in $(seq 1 200); do
    if grep -q '^READY' "$1" 2>/dev/null; then grep -m1 '^READY' "$1"; return 0; fi
    sleep 0.1
  done
  echo "no READY line in $1" >&2; cat "$1" >&2; return 1
}

workers=()
for i in 0 1; do
  $PY -m proxy.sim --port 0 --profile zero --enable-metrics --enable-cache-report >"$work/w$i" 2>&1 &
  pids+=($!)
  workers+=(--worker "$(ready_url "$work/w$i" | awk '{print $2}')")
done
$PY -m proxy serve --port 0 --admin-port 0 "${workers[@]}" >"$work/proxy" 2>&1 &
pids+=($!)
line=$(ready_url "$work/proxy")
http=$(sed -E 's/.*http=[^ ]*:([0-9]+).*/\1/' <<<"$line")
admin=$(sed -E 's/.*admin=[^ ]*:([0-9]+).*/\1/' <<<"$line")
for i in $(seq 1 20); do
  curl -sf "http://127.0.0.1:$http/generate" -H 'content-type: application/json' \
    -d "{\"text\": \"shared system prompt, question $((i % 4))\", \"sampling_params\": {\"max_new_tokens\": 8}, \"stream\": $([ $((i % 2)) = 0 ] && echo true || echo false)}" >/dev/null
done
curl -sf "http://127.0.0.1:$admin/metrics" >"$work/metrics.txt"
echo "scraped $(grep -c '^radixgate_' "$work/metrics.txt") radixgate_ samples from the running proxy"
promtool check metrics <"$work/metrics.txt" && echo "promtool check metrics: no problems found"
