#!/usr/bin/env bash
# GPU smoke run of mutual-rl: a reduced paper-like pair (Qwen2.5-1.5B- and Qwen3-1.7B-shaped policies,
# a few layers each, random init, two locally made tokenizers) trained for a few steps on one GPU with
# whichever rollout engine is installed (vLLM if present, HF otherwise); writes tokens/s for generation
# and training and peak memory to OUT/smoke.json (default runs/gpu-smoke/).
# Then it checks one Qwen2.5-1.5B-shaped policy (28 layers, real vocabulary, 64 rows x 512 tokens, bf16): the
# planner's memory estimate against the reserved peak, bf16 against fp32, and the weights each mini-batch sees
# under bf16 (experiments/gpu/smoke_checks.py); it exits 1 naming each check that fails.
#
# Runs from the source tree with only Python, torch and transformers installed: no install step, no
# download, no Ray / vLLM / math-verify / gymnasium needed.
#
#   experiments/gpu/smoke.sh                 # on the GPU (about a minute or two on an H200-class GPU)
#   experiments/gpu/smoke.sh --cpu           # tiny sizes on the CPU (what CI runs)
#   experiments/gpu/smoke.sh --checks-only   # the checks alone
#   experiments/gpu/smoke.sh --steps 6 --out /tmp/smoke --engine hf
#   experiments/gpu/smoke.sh --ranks 2       # one policy on 2 FSDP2 ranks (2 GPUs) vs 1 rank; --cpu: gloo
#   experiments/gpu/smoke.sh --ranks 2 --fsdp-unit layer --grad-sync mini_batch   # units kept gathered a mini-batch
#
# PYTHON selects the interpreter (default: python3).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
cd "$REPO"
exec "${PYTHON:-python3}" -m experiments.gpu.smoke "$@"
