#!/usr/bin/env bash
# The test suite, exactly as CI runs it (.ci/run calls this script).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
exec python -m pytest -q -p no:cacheprovider "$@"
