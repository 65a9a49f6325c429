#!/usr/bin/env bash
# Installs frnccl into the current Python environment, building the C++
# extension against the torch that is already there.
#   bash scripts/install.sh          # torch (2.13.0 CPU if none yet) + frnccl
#   bash scripts/install.sh --test   # the same, plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "frnccl: no torch found; installing torch==2.13.0" >&2
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q ninja "setuptools>=64" wheel
if [ "${1:-}" = "--test" ]; then
  "$PY" -m pip install -q pytest pytest-timeout hypothesis
fi
# No build isolation: an isolated build would install its own torch (a CUDA
# build of several GB) just to compile against it.
MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install -q --no-build-isolation .
"$PY" -c "import fr_backend, torch; print(f'frnccl installed (torch {torch.__version__})')"
