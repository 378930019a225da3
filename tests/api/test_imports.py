"""No import cycle between the modules of specdec_ext, triton_kernels and bench, read from the sources.

Every ``import`` counts, wherever it is (module level, inside a function, under TYPE_CHECKING): a
function-level import hides a cycle from the interpreter, not from the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specdec_ext", "triton_kernels", "bench")
ALIASES = {"specdec_ext.kernels": "triton_kernels"}  # the kernels' installed name (setup.py's package_dir)


def _module_files() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _canonical(name: str) -> str:
    for alias, target in ALIASES.items():
        if name == alias or name.startswith(alias + "."):
            return target + name[len(alias):]
    return name


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``module`` imports (a package counts as its __init__)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = set()

    def add(name: str) -> None:
        name = _canonical(name)
        while name and name not in known:  # `import a.b.c` of a name inside a module: the module
            name = name.rpartition(".")[0]
        if name and name != module:
            edges.add(name)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = _canonical(f"{base}.{alias.name}")
                if submodule in known:
                    add(submodule)
                elif not _is_compiled_module(submodule):
                    add(base)  # a name defined in `base` (or its __init__)
    return edges


def _is_compiled_module(name: str) -> bool:
    """A C++ extension next to the sources (specdec_ext._C): no Python imports of its own."""
    folder, _, stem = name.rpartition(".")
    directory = ROOT.joinpath(*folder.split("."))
    return directory.is_dir() and any(p.suffix in (".so", ".pyd") for p in directory.glob(f"{stem}.*"))


def import_graph() -> dict[str, set[str]]:
    known = _module_files()
    return {module: _imports(module, path, known) for module, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_graph_covers_the_three_packages():
    graph = import_graph()
    assert {"specdec_ext.api", "specdec_ext._dispatch", "specdec_ext.prepared", "specdec_ext.generation.loop", "triton_kernels", "bench.host_overhead"} <= set(graph)
    # Spot checks of the resolution: relative imports, the kernels' alias, a compiled extension ignored.
    assert "specdec_ext._params" in graph["specdec_ext.api"]
    assert "triton_kernels" in graph["specdec_ext._triton_backend"]
    assert "specdec_ext.ops" in graph["specdec_ext._dispatch"] and "specdec_ext._cpp_backend" in graph["specdec_ext.ops"]
    assert {"specdec_ext.reference", "specdec_ext.reference_tree", "specdec_ext._triton_tree"} <= graph["specdec_ext._dispatch"]  # the table's modules
    assert "specdec_ext" not in graph["specdec_ext._cpp_backend"]  # `from . import _C` is the extension, not the package


def test_the_installed_packages_never_import_bench():
    """bench/ exists in a source checkout only: an import of it from specdec_ext or the kernels fails once installed."""
    graph = import_graph()
    installed = {module: sorted(e for e in edges if e.split(".")[0] == "bench") for module, edges in graph.items() if module.split(".")[0] != "bench"}
    assert not any(installed.values()), {module: edges for module, edges in installed.items() if edges}


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_the_check_finds_cycles():
    """The same check rejects a graph with a cycle (and the former api <-> tree and _cpp_backend <-> ops ones)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    graph["specdec_ext._cpp_backend"] = graph["specdec_ext._cpp_backend"] | {"specdec_ext.ops"}
    assert any({"specdec_ext._cpp_backend", "specdec_ext.ops"} <= cycle for cycle in cycles(graph))  # (with the modules between them)
