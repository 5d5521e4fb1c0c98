"""The package's import graph points one way: hooks → reducers → measure / result →
analyses → report → applications (grid, head view, CLI). No cycle, no import hidden in a
function to dodge one, no private name imported across modules."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"poskernel_tl": "poskernel_tl", "hooks": "poskernel_tl.hooks",
            "analyses": "poskernel_tl.analyses"}
# lower rank = lower layer; a module may import modules of its own rank or below
RANKS = [
    ("poskernel_tl.errors", "poskernel_tl.protocol", "poskernel_tl.constants",
     "poskernel_tl.io", "poskernel_tl.registry", "poskernel_tl.schema",
     "poskernel_tl.scheme", "poskernel_tl.progress"),
    ("poskernel_tl.hooks", "poskernel_tl.toeplitz", "poskernel_tl.bands",
     "poskernel_tl.kernel_class", "poskernel_tl.datasets", "poskernel_tl.sequences",
     "poskernel_tl.embedded", "poskernel_tl.loading",
     "poskernel_tl.batching", "poskernel_tl.track_b_cost",
     "poskernel_tl.manifest", "poskernel_tl.config", "poskernel_tl.inputs"),
    ("poskernel_tl.reducers", "poskernel_tl.pe_kernel"),
    ("poskernel_tl.measure", "poskernel_tl.result",
     "poskernel_tl.runner"),
    ("poskernel_tl.analyses", "poskernel_tl.analyze"),
    ("poskernel_tl.report",),
    ("poskernel_tl.head_view", "poskernel_tl.head_view_cli", "poskernel_tl.grid",
     "poskernel_tl.executor", "poskernel_tl.cli", "poskernel_tl"),
]


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def rank(module: str) -> int:
    best = None
    for i, prefixes in enumerate(RANKS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (
                    best is None or len(p) > best[1]):
                best = (i, len(p))
    if best is None:
        raise AssertionError(f"{module} has no layer in RANKS: add it")
    return best[0]


def edges(mods: dict[str, Path]):
    """(importer, imported module, name imported or None, function-local, line)."""
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        local = {id(n) for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [(f"{node.module}.{a.name}", a.name) for a in node.names]
            else:
                continue
            for target, name in targets:
                if not target.startswith("poskernel_tl"):
                    continue
                t = target
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if name is not None and t == target:  # `from pkg import submodule`
                    name = None
                yield mod, t, name, id(node) in local, node.lineno


MODS = modules()
EDGES = list(edges(MODS))


def test_every_module_has_a_layer():
    for m in MODS:
        rank(m)


def test_imports_point_down():
    up = [f"{a} (layer {rank(a)}) imports {b} (layer {rank(b)}), line {n}"
          for a, b, _, _, n in EDGES if rank(b) > rank(a)]
    assert not up, "upward imports:\n" + "\n".join(up)


# imports deferred for their cost, not to dodge a cycle (they point down like the rest):
# the fast attention classes subclass TransformerLens's, whose import takes ~10 s
DEFERRED = {("poskernel_tl.loading", "poskernel_tl.hooks.fast_attention")}


def test_no_function_local_imports():
    hidden = [f"{a} line {n}: {b}" for a, b, _, is_local, n in EDGES
              if is_local and (a, b) not in DEFERRED]
    assert not hidden, "imports inside functions:\n" + "\n".join(hidden)


def test_no_private_names_across_modules():
    private = [f"{a} line {n}: {b}.{name}" for a, b, name, _, n in EDGES
               if name and name.startswith("_") and not name.startswith("__")]
    assert not private, "private names imported:\n" + "\n".join(private)


def test_no_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODS}
    for a, b, _, _, _ in EDGES:
        # a package's __init__ may re-export its own submodules
        if a != b and not b.startswith(a + "."):
            graph[a].add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_every_package_is_in_the_wheel():
    """pyproject lists its packages one by one: a package folder missing there installs
    from a checkout but not from a wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join([package, *init.parent.relative_to(ROOT / folder).parts])
             for folder, package in PACKAGES.items()
             for init in (ROOT / folder).rglob("__init__.py")}
    assert found == listed
