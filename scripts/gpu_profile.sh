#!/usr/bin/env bash
# Measure this machine's GPU profile (roofline, KV hand-off paths, step times) and write JSON.
#
#   scripts/gpu_profile.sh --size full --out data/profiles     # on a GPU box: < 8 min on one H200
#   scripts/gpu_profile.sh --size smoke --out build/gpu-profile  # seconds; on a CPU too (make test runs it)
#
# A thin wrapper around `pdlab gpu-profile` (helpers/pdlab/cli/gpu_profile.py; the work is in
# helpers/pdlab/simreal/gpu_profile.py); every argument is passed on (--help lists them).
# It uses the repository's .venv when there is one, else `python3` with pdlab installed, else
# (a bare GPU image with torch and numpy but without this package installed) `python3` with the
# repository's helpers/ on PYTHONPATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="${PYTHON:-python3}"
fi
if ! "$PY" -c "import pdlab" 2>/dev/null; then
    export PYTHONPATH="$ROOT/helpers${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" -m pdlab.cli.gpu_profile "$@"
