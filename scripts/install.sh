#!/usr/bin/env bash
# Create the virtual environment and install the project with what its tests need.
# Usage: scripts/install.sh PYTHON VENV
set -euo pipefail
python_bin=${1:-python3}
venv=${2:-.venv}

if [ ! -x "$venv/bin/python" ]; then
    "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
# torch first, from the pinned CPU build (elsewhere: --index-url https://download.pytorch.org/whl/cpu).
"${pip[@]}" install --quiet "torch==2.13.0"
"${pip[@]}" install --quiet -e ".[dev]"
# Register the course kernel inside the venv (papermill and JupyterLab use it by name).
"$venv/bin/python" -m ipykernel install --sys-prefix --name pdlab --display-name "Python (pdlab course)" >/dev/null
echo "installed pdlab into $venv"
