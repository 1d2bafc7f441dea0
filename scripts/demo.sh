#!/usr/bin/env bash
# The main job: radixgate in front of simulated SGLang workers under a real workload;
# prints the stage breakdown and the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m proxy demo "$@"
