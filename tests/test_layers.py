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
    # sim-to-real's records, fits and replays: typed calibration records, pure fits, replays, sim-vs-real
    # statistics, the GPU profile (measure and fit sim latency); the schedulers and the peers use them
    "pdlab.simreal": 4,
    # 5 — live serving (serve/: engines, client, measure, experiments, and the live probes, which
    # measure and fit nothing), router server and client; the course beside peer tools (peers/:
    # Dynamo's replay and planner, AIConfigurator), built on sched and simreal
    "pdlab.serve": 5, "pdlab.router.server": 5, "pdlab.router.client": 5, "pdlab.peers": 5,
    # 6 — sim-to-real's first stage, above the serving it measures through: run the live probes, fit
    # their points (calibrate)
    "pdlab.simreal.probes": 6,
    # 7 — course, widgets, exercises, cli
    "pdlab.course": 7, "pdlab.widgets": 7, "pdlab.exercises": 7, "pdlab.cli": 7,
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
    assert _subpackage("pdlab.simreal.probes.run") == "pdlab.simreal.probes"
    assert "pdlab.serve" in graph["pdlab.simreal.probes"] and "pdlab.serve" not in graph["pdlab.simreal"]


#: Packages whose ``__init__`` is a module in its own right, not a front file: the check helpers every
#: exercise module uses, and the ``pdlab`` command.
OWN_CODE_IN_INIT = {"pdlab.exercises", "pdlab.cli"}


def front_files() -> dict[str, Path]:
    """Every package's ``__init__`` that is a front file, by package name."""
    fronts = {}
    for init in sorted(PKG.rglob("__init__.py")):
        package = _module_name(init)
        if package != "pdlab" and package not in OWN_CODE_IN_INIT:
            fronts[package] = init
    return fronts


def front_file_problems(package: str, path: Path) -> tuple[list[str], set[str]]:
    """What breaks the front-file rule in ``path`` (the ``__init__`` of ``package``), and the names it exports.

    The rule: ``__all__`` is a literal list of names (no ``*`` import, no ``*other.__all__``); each name is
    bound by ``from <module> import name`` where ``<module>`` is one of the package's own modules, and
    defined there (a ``def``, ``class`` or assignment), not imported into it from elsewhere. The
    lazy names of a module-level ``__getattr__`` count when ``_PLOT_NAMES``-style tuples name them and the
    module they come from is the package's own."""
    tree = ast.parse(path.read_text(), str(path))
    problems: list[str] = []
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    problems.append(f"{package}: star import from {node.module}")
                else:
                    bound[alias.asname or alias.name] = node.module or ""
    exported: set[str] = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not (isinstance(target, ast.Name) and target.id == "__all__") or node.value is None:
            continue
        for elt in getattr(node.value, "elts", []):
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                exported.add(elt.value)
            else:
                problems.append(f"{package}: __all__ holds {ast.unparse(elt)}, not a literal name")
    lazy = _lazy_names(tree)
    for name in sorted(exported):
        module = bound.get(name) or lazy.get(name)
        if module is None:
            problems.append(f"{package} exports {name} without importing it by name")
        elif not (module + ".").startswith(package + "."):
            problems.append(f"{package} re-exports {name} from {module}, outside the package: import it from there")
        elif name not in _defined_in(module):
            problems.append(f"{package} re-exports {name} from {module}, which imports it from elsewhere")
    return problems, exported


def _lazy_names(tree: ast.Module) -> dict[str, str]:
    """Names a front file's module-level ``__getattr__`` serves, mapped to the module it imports them from
    (``pdlab.roofline`` loads its plot names on first use)."""
    getattr_fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None)
    if getattr_fn is None:
        return {}
    modules = {f"{n.module}.{a.name}" for n in ast.walk(getattr_fn) if isinstance(n, ast.ImportFrom) for a in n.names}
    names = {elt.value for node in tree.body if isinstance(node, ast.Assign)
             for elt in getattr(node.value, "elts", []) if isinstance(elt, ast.Constant)}
    return {name: module for module in sorted(modules) for name in names if name in _defined_in(module)}


def _defined_in(module: str) -> set[str]:
    """The names ``module``'s own top level defines (``def``, ``class``, assignment), read from its file."""
    base = PKG.parent / Path(*module.split("."))
    path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
    if not path.exists():
        return set()
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_front_files_list_their_own_names_by_name():
    """Each front file lists its exports by name, each defined in one of its own package's modules."""
    problems = [p for package, path in front_files().items() for p in front_file_problems(package, path)[0]]
    assert not problems, "\n".join(problems)


def test_no_name_has_two_front_files():
    """A public name has one home: no two front files export the same name."""
    homes: dict[str, list[str]] = {}
    for package, path in front_files().items():
        for name in front_file_problems(package, path)[1]:
            homes.setdefault(name, []).append(package)
    twice = {name: packages for name, packages in sorted(homes.items()) if len(packages) > 1}
    assert not twice, f"names exported by more than one front file: {twice}"


def test_no_star_import_in_helpers():
    offenders = [f"{_module_name(path)}: from {node.module} import *"
                 for path in sorted(PKG.rglob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)]
    assert not offenders, "\n".join(offenders)


def test_front_file_rule_catches_what_it_should(tmp_path):
    good, exported = front_file_problems("pdlab.sim", PKG / "sim" / "__init__.py")
    assert not good and "Simulator" in exported
    assert "add_points" in front_file_problems("pdlab.roofline", PKG / "roofline" / "__init__.py")[1]  # lazy
    bad = tmp_path / "front.py"
    bad.write_text("from pdlab.process import free_port\nfrom pdlab.sim.engine import *\n"
                   "from pdlab.sim.latency import Request\n"
                   "__all__ = ['free_port', 'Request', 'nowhere', *engine.__all__]\n")
    problems, _ = front_file_problems("pdlab.sim", bad)
    text = "\n".join(problems)
    assert "star import from pdlab.sim.engine" in text
    assert "re-exports free_port from pdlab.process, outside the package" in text
    assert "re-exports Request from pdlab.sim.latency, which imports it from elsewhere" in text
    assert "exports nowhere without importing it" in text
    assert "not a literal name" in text


def test_transfer_imports_nothing_from_serve():
    """The transfer measurements (layer 2) use the foundation's process supervisor, never the serving layer."""
    offenders = [f"{_module_name(path)} imports {dep}"
                 for path in sorted((PKG / "transfer").rglob("*.py"))
                 for dep in sorted(pdlab_imports(path)) if dep == "pdlab.serve" or dep.startswith("pdlab.serve.")]
    assert not offenders, "transfer/ imports the serving layer:\n" + "\n".join(offenders)


def test_serve_imports_nothing_from_simreal():
    """The live probes measure, sim-to-real fits: no module under serve/ imports pdlab.simreal, lazily either
    (pdlab.simreal.probes runs the probes and fits their points)."""
    offenders = [f"{_module_name(path)} imports {dep}"
                 for path in sorted((PKG / "serve").rglob("*.py"))
                 for dep in sorted(pdlab_imports(path)) if dep == "pdlab.simreal" or dep.startswith("pdlab.simreal.")]
    assert not offenders, "serve/ imports sim-to-real:\n" + "\n".join(offenders)


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
