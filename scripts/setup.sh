#!/usr/bin/env bash
# Set up specctl on a fresh machine: a virtualenv in .venv with the project and its test tools.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first, pinned: the CPU wheel of 2.13.0; an open range would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "specctl is set up in .venv ($(.venv/bin/specctl --help >/dev/null && echo ok))"
