#!/usr/bin/env bash
# Creates .venv with torch pinned first (the CPU build; an unpinned torch pulls CUDA), then the project.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"torch was changed to {torch.__version__}; reinstall torch==2.13.0"
print(f"environment ready: torch {torch.__version__}")
PY
