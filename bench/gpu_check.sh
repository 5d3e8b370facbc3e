#!/usr/bin/env bash
# One-GPU check (issue: GPU-ready inference actors), under 8 minutes on one GPU machine:
# set up, mask a few thousand 2 MP photos with --device cuda, print img/s, GPU and CPU utilisation
# and agreement with the CPU masks.   bench/gpu_check.sh [--images 3000] [--engine torch|ort]
#
# Set-up, in order: an environment that already has ray and maskray's deps (used as is); else
# wheels in $WHEELS (an offline machine: unpacked into a private site folder, nothing installed);
# else a fresh venv with `pip install -e .[cuda]` (PyPI reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import ray, pydantic, cv2, pyarrow" 2>/dev/null; then
  if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then
    SITE=/tmp/maskray-site
    mkdir -p "$SITE"
    for w in "$WHEELS"/*.whl "$WHEELS"/*.zip; do [ -e "$w" ] && $PY -m zipfile -e "$w" "$SITE"; done
    chmod -R u+x "$SITE"/ray/core/src 2>/dev/null || true
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    $PY -m venv .venv-gpu && .venv-gpu/bin/pip install --quiet -e '.[cuda]' && PY=.venv-gpu/bin/python
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -f models/u2netp.onnx ] || $PY -m maskray.pipeline.cli fetch-model --dest models/u2netp.onnx
exec timeout 460 $PY bench/gpu_check.py "$@"
