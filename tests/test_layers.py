"""The layer rule of pdlab (docs/CONTRIBUTING.md): no module imports from a layer above its own.

Every ``import pdlab...`` in every module counts, also the lazy ones inside functions: a lazy
upward import is still a dependency on the layer above. The test reads the sources (``ast``) and
runs nothing. A new module must be given a layer here (longest matching prefix wins).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "helpers" / "pdlab"

#: Lowest first. Keys are module names or package prefixes; the longest matching key wins.
LAYERS: dict[str, int] = {
    # 0 — foundation: paths, catalog data (GPUs, links, models), plot style, process hygiene
    "pdlab": 0, "pdlab.paths": 0, "pdlab.catalog": 0, "pdlab.hardware": 0, "pdlab.models": 0,
    "pdlab.plots": 0,
    "pdlab.process": 0,  # the one process supervisor and free_port; transfer peers use it too
    # 1 — workloads and metrics (what arrives, how it is scored; prefix-block hashing)
    "pdlab.workloads": 1, "pdlab.metrics": 1, "pdlab.kvcache": 1,
    # 2 — analysis: roofline, KV transfer (napkin and measured)
    "pdlab.roofline": 2, "pdlab.transfer": 2,
    # 3 — the one simulator engine
    "pdlab.sim": 3,
    # 4 — built on the simulator: schedulers (queueing check, placement, Conductor, pools), the
    # router's simulation and policies, calibration fits, sim-vs-real statistics
    "pdlab.sched": 4,  # also deploy_export: placements written as Dynamo / llm-d deployments
    "pdlab.router": 4, "pdlab.router.sim": 4, "pdlab.router.policies": 4,
    # sim-to-real: typed calibration records, pure fits and replays (the live probes are pdlab.serve.probes),
    # sim-vs-real statistics, AIConfigurator comparison, the GPU profile (measure and fit sim latency)
    "pdlab.simreal": 4,
    # 5 — live serving (serve/: engines, client, measure, experiments), router server and client; the
    # course beside peer tools (peers/: Dynamo's replay and planner, AIConfigurator), built on sched and simreal
    "pdlab.serve": 5, "pdlab.router.server": 5, "pdlab.router.client": 5, "pdlab.peers": 5,
    # 6 — course, widgets, exercises, cli
    "pdlab.course": 6, "pdlab.widgets": 6, "pdlab.exercises": 6, "pdlab.cli": 6,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len, default=None)
    if best is None:
        raise KeyError(f"{module} has no layer: add it to LAYERS in tests/test_layers.py")
    return LAYERS[best]


def pdlab_imports(path: Path) -> set[str]:
    """Every pdlab module ``path`` imports (``from pdlab.x import y`` counts as ``pdlab.x.y`` when that
    is a module, else ``pdlab.x``)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "pdlab")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "pdlab":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PKG.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (PKG.parent / Path(*sub.split(".")) / "__init__.py").exists()
                out.add(sub if is_module else node.module)
    return out


def test_every_module_has_a_layer():
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        try:
            layer_of(_module_name(path))
        except KeyError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(PKG.rglob("*.py")):
        name = _module_name(path)
        if name == "pdlab":
            continue
        mine = layer_of(name)
        for dep in sorted(pdlab_imports(path)):
            if dep == name or name.startswith(dep + "."):  # a package's own __init__
                continue
            if layer_of(dep) > mine:
                upward.append(f"{name} (layer {mine}) imports {dep} (layer {layer_of(dep)})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def _subpackage(module: str) -> str:
    """The package a module belongs to: ``pdlab.sim.engine`` → ``pdlab.sim``, ``pdlab.serve.engines.vllm``
    → ``pdlab.serve.engines`` (a package inside a package counts on its own), ``pdlab.serve.probes`` →
    ``pdlab.serve``; a top-level module (``pdlab.models``) is its own."""
    parts = module.split(".")
    if len(parts) >= 3 and (PKG.parent / Path(*parts[:3]) / "__init__.py").exists():
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def subpackage_graph() -> dict[str, set[str]]:
    """Which subpackages each subpackage imports (lazy imports included; the root ``pdlab`` left out)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        name = _module_name(path)
        if name == "pdlab":
            continue
        mine = _subpackage(name)
        deps = graph.setdefault(mine, set())
        deps.update(_subpackage(d) for d in pdlab_imports(path) if d != "pdlab" and _subpackage(d) != mine)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: each strongly connected set of more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def test_no_import_circle_between_subpackages():
    circles = import_circles(subpackage_graph())
    assert not circles, "subpackages that import each other (directly or round a circle):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
    graph = subpackage_graph()
    assert "pdlab.sim" in graph["pdlab.sched"]
    assert "pdlab.serve.proxy" in graph["pdlab.router"]   # the router uses the proxy's public face
    assert _subpackage("pdlab.serve.engines.vllm") == "pdlab.serve.engines"
    assert _subpackage("pdlab.serve.probes") == _subpackage("pdlab.serve") == "pdlab.serve"


#: Packages whose ``__init__`` is a module in its own right, not a front file: the check helpers every
#: exercise module uses, and the ``pdlab`` command.
OWN_CODE_IN_INIT = {"pdlab.exercises", "pdlab.cli"}
#: Names a front file re-exports from outside its package: ``pdlab.serve`` carries the process hygiene
#: of :mod:`pdlab.process` beside the launchers (the labs import both from one place).
FOREIGN_REEXPORTS = {"pdlab.serve": {"PortInUseError", "ServerStartError", "free_port", "live_processes", "stop_all"}}


def _submodule_names(package: str) -> set[str]:
    """The ``__all__`` of every module and subpackage directly inside ``package`` (read, not imported)."""
    folder = PKG.parent / Path(*package.split("."))
    names: set[str] = set()
    for path in sorted(folder.glob("*.py")) + sorted(folder.glob("*/__init__.py")):
        if path.name in ("__init__.py", "__main__.py") and path.parent == folder:
            continue
        names |= _declared_all(path)
    return names


def _declared_all(path: Path) -> set[str]:
    """The literal names of a module's ``__all__``, the ``*other.__all__`` parts followed to ``other``'s file."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {a.asname: a.name for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names if a.asname}
    names: set[str] = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not (isinstance(target, ast.Name) and target.id == "__all__") or node.value is None:
            continue
        for elt in getattr(node.value, "elts", []):
            if isinstance(elt, ast.Constant):
                names.add(elt.value)
            elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Attribute):
                sub = aliases.get(elt.value.value.id, elt.value.value.id)
                other = path.parent / f"{sub}.py"
                names |= _declared_all(other if other.exists() else path.parent / sub / "__init__.py")
    return names


def test_every_front_file_re_exports_its_submodules_names():
    """Each package's ``__init__`` is a front file: a non-empty ``__all__`` made of its own modules' public names."""
    problems = []
    for init in sorted(PKG.rglob("__init__.py")):
        package = _module_name(init)
        if package == "pdlab" or package in OWN_CODE_IN_INIT:
            continue
        exported = _declared_all(init)
        if not exported:
            problems.append(f"{package}: __all__ is empty; re-export the submodules' public names")
            continue
        foreign = exported - _submodule_names(package) - FOREIGN_REEXPORTS.get(package, set())
        if foreign:
            problems.append(f"{package} exports names none of its modules declares: {sorted(foreign)}")
    assert not problems, "\n".join(problems)


def test_front_file_reader(tmp_path):
    assert "Simulator" in _declared_all(PKG / "sim" / "__init__.py")
    assert {"run_bench", "VLLMServer", "measure_cpu"} <= _declared_all(PKG / "serve" / "__init__.py")  # followed
    assert "PlannerRun" in _submodule_names("pdlab.peers")
    empty = tmp_path / "front.py"
    empty.write_text("from x import y\n__all__: list[str] = []\n")
    assert _declared_all(empty) == set()


def test_transfer_imports_nothing_from_serve():
    """The transfer measurements (layer 2) use the foundation's process supervisor, never the serving layer."""
    offenders = [f"{_module_name(path)} imports {dep}"
                 for path in sorted((PKG / "transfer").rglob("*.py"))
                 for dep in sorted(pdlab_imports(path)) if dep == "pdlab.serve" or dep.startswith("pdlab.serve.")]
    assert not offenders, "transfer/ imports the serving layer:\n" + "\n".join(offenders)


def test_the_rule_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from pdlab.sim.engine import Simulator\n")
    assert "pdlab.sim.engine" in pdlab_imports(bad)
    assert layer_of("pdlab.sim.engine") > layer_of("pdlab.roofline.analytic")
    with pytest.raises(KeyError, match="no layer"):
        layer_of("elsewhere.module")


@pytest.mark.parametrize("module", ["pdlab.roofline.analytic", "pdlab.roofline", "pdlab.sim", "pdlab.workloads"])
def test_analysis_imports_no_plotting(module):
    code = f"import sys, {module}; assert 'plotly' not in sys.modules, 'plotly imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
