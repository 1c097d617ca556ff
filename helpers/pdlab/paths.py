"""Where the course's files live: the repository root, ``data/`` and ``build/``.

The package is installed editable (``pip install -e .``) from the repository, so the data
files are found next to it. ``PDLAB_DATA_DIR`` and ``PDLAB_BUILD_DIR`` override the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["repo_root", "data_dir", "build_dir", "peers_venv", "catalog_path", "read_json"]


def repo_root() -> Path:
    """The repository root (the folder holding ``pyproject.toml``)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").exists() and (parent / "helpers").is_dir():
            return parent
    return here.parents[2]


def data_dir() -> Path:
    """The ``data/`` folder: catalogs, traces, measured profiles."""
    env = os.environ.get("PDLAB_DATA_DIR")
    return Path(env) if env else repo_root() / "data"


def build_dir() -> Path:
    """The ``build/`` folder for executed notebooks, logs and benchmark outputs (created on use)."""
    env = os.environ.get("PDLAB_BUILD_DIR")
    path = Path(env) if env else repo_root() / "build"
    path.mkdir(parents=True, exist_ok=True)
    return path


def peers_venv() -> Path:
    """The peers' virtual environment (Dynamo, vllm-router; made by ``scripts/install_peers.sh``):
    ``PDLAB_PEERS_VENV``, else ``<repo>/.venv-peers``. It may not exist."""
    env = os.environ.get("PDLAB_PEERS_VENV")
    return Path(env) if env else repo_root() / ".venv-peers"


def catalog_path(name: str) -> Path:
    """Path of a catalog file under ``data/catalog/`` (e.g. ``catalog_path("gpus.yaml")``)."""
    return data_dir() / "catalog" / name


def read_json(path: str | Path, what: str) -> Any:
    """The JSON in ``path``: FileNotFoundError "no {what} at PATH" when it is missing, ValueError naming
    the file, the parser's message and the line when it is not JSON."""
    import json

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
