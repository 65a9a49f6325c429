#!/usr/bin/env bash
# Installs the training stacks whose real packages test/stacks runs frnccl under, at the releases those tests
# were written against, into the current Python environment (frnccl installed first: scripts/install.sh --test).
# The environment's torch is kept as it is: pip is told the installed version, so a stack that asks for another
# torch fails to install here instead of pulling a CUDA build into a CPU environment.
#   bash scripts/install_stacks.sh && python3 -m pytest -q test/stacks
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
torch_version=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])") || {
  echo "frnccl: no torch in this environment; run bash scripts/install.sh --test first" >&2
  exit 1
}
# torchft's wheel brings its lighthouse (torchft_lighthouse) and asks for torch>=2.7, which the pin keeps as is.
"$PY" -m pip install -q "pytorch-lightning==2.6.6" "accelerate==1.16.0" "torchft==0.2.0" "torch==$torch_version"
"$PY" -c "from importlib.metadata import version as v; import torch; print(f'stacks installed: pytorch-lightning {v(\"pytorch-lightning\")}, accelerate {v(\"accelerate\")}, torchft {v(\"torchft\")} (torch {torch.__version__})')"
