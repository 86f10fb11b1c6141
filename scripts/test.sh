#!/usr/bin/env bash
# Set up the environment (with the CPU vLLM engine) and run the test suite.
#
#   scripts/test.sh             the default suite (everything not marked slow)
#   scripts/test.sh --slow      only the tests marked slow (CI runs both)
#   scripts/test.sh -- ARGS     extra pytest arguments after --
set -euo pipefail
cd "$(dirname "$0")/.."
marker="not slow"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --slow) marker="slow"; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "test.sh: unknown option $1 (use --slow, or -- PYTEST_ARGS)" >&2; exit 2 ;;
  esac
done
scripts/setup.sh --vllm
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
# pytest exits 5 when it collects no test: that is a failure here too (set -e).
exec "${MRL_VENV:-.venv}/bin/python" -m pytest -m "$marker" "${extra[@]}"
