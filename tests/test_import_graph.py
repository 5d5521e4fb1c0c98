"""The package's import graph points one way, folder by folder: the core (the modules
directly under ``poskernel_tl/``) → models and hooks → data → fit → reducers → statistics → plan →
measurement → analyses → report → run → apps and the public API. No cycle, no import
hidden in a function to dodge one, no private name imported across modules, and every
name imported from the module that defines it (no re-exports, but for a package's public
``__init__``)."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"poskernel_tl": "poskernel_tl", "hooks": "poskernel_tl.hooks",
            "analyses": "poskernel_tl.analyses"}
# The layers above the core, lowest first: each names folders (subpackages of poskernel_tl,
# with everything inside them). A module may import its own layer or any below; the core
# (rank 0: errors, protocol, constants, io, schema, progress, mask) imports only the core, so a
# module that needs a folder belongs in a folder. The package's own ``__init__`` (the
# public API) is the top.
RANKS = [
    ("hooks",),  # the capture of q/k and the fast attention path (reads a scheme's fields)
    ("models",),  # the model: registry, schemes, loading (installs the hooks' fast path)
    ("data",),
    ("fit",),
    ("kernels",),  # the GPU's tiled kernels (Triton), which the reducers call
    ("reducers",),  # the engine; each states its own memory (and Track B its time) for the plan
    ("statistics",),  # the per-head statistics that plug into a run, on the engine
    ("plan",),
    ("measurement",),
    ("analyses",),
    ("report",),
    ("run",),
    ("apps",),
]
CORE, TOP = 0, len(RANKS) + 1


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def rank(module: str) -> int:
    if module == "poskernel_tl":
        return TOP
    folder = module.split(".")[1]
    for i, folders in enumerate(RANKS):
        if folder in folders:
            return i + 1
    if module.count(".") == 1 and MODS[module].name != "__init__.py":
        return CORE
    raise AssertionError(f"{module} is in no folder of RANKS: add its folder")


def imports(tree: ast.Module):
    """(import statement, whether it sits inside a function) for each of ``tree``'s."""
    stack = [(tree, False)]
    while stack:
        node, local = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, local
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def edges(mods: dict[str, Path]):
    """(importer, imported module, name imported or None, function-local, line)."""
    for mod, path in mods.items():
        for node, local in imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif node.module and node.level == 0:
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
                yield mod, t, name, local, node.lineno


MODS = modules()
EDGES = sorted(edges(MODS), key=lambda e: (e[0], e[4]))


def test_every_module_has_a_layer():
    for m in MODS:
        rank(m)


def test_imports_point_down():
    up = [f"{a} (layer {rank(a)}) imports {b} (layer {rank(b)}), line {n}"
          for a, b, _, _, n in EDGES if rank(b) > rank(a)]
    assert not up, "upward imports:\n" + "\n".join(up)


# imports deferred for their cost, not to dodge a cycle (they point down like the rest):
# the fast attention classes subclass TransformerLens's, whose import takes ~10 s; the
# command line imports the commands (torch, the models) and the analyses only once its
# input is parsed and checked, so that --help and a bad flag answer at once
DEFERRED = {("poskernel_tl.models.loading", "poskernel_tl.hooks.fast_attention"),
            ("poskernel_tl.apps.cli", "poskernel_tl.apps.commands"),
            ("poskernel_tl.apps.cli", "poskernel_tl.analyses.registry")}


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
    from a checkout but not from a wheel. Folders of data files only (the viewer's
    ``report/static``) are listed too, with their files as package data (setuptools warns
    of a data folder that is not a listed package)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, data = set(tool["packages"]), set(tool["package-data"])
    found = {".".join([package, *init.parent.relative_to(ROOT / folder).parts])
             for folder, package in PACKAGES.items()
             for init in (ROOT / folder).rglob("__init__.py")}
    assert found | data == listed
    for name in data - found:
        assert (ROOT / name.replace(".", "/")).is_dir(), name


def test_no_module_imports_its_own_package():
    """A package's ``__init__`` runs before its modules and may import them: a module that
    reads names from the ``__init__`` of a package holding it closes a cycle."""
    inward = [f"{a} line {n}: {b}" for a, b, _, _, n in EDGES if a.startswith(b + ".")]
    assert not inward, "modules importing their own package:\n" + "\n".join(inward)


def defined(tree: ast.Module) -> set[str]:
    """The names a module binds itself at its top level: not those it imports, but for an
    import it chooses under an ``if`` or ``try``."""
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            # an import under a top-level if/try chooses the binding (progress.tqdm)
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            body += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            body += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def test_names_come_from_the_module_that_defines_them():
    """``from M import name`` reads ``name`` where it is defined: no module re-exports
    another's names. A package's ``__init__`` may gather its own submodules' names (its
    API: ``poskernel_tl.reducers``, ``poskernel_tl.hooks``)."""
    trees = {m: ast.parse(p.read_text()) for m, p in MODS.items()}
    found = [f"{a} line {n}: {b}.{name}" for a, b, name, _, n in EDGES
             if name and name not in defined(trees[b])
             and not (MODS[b].name == "__init__.py" and any(
                 src.startswith(b + ".") for src in imported_from(trees[b], name)))]
    assert not found, "names imported from a module that does not define them:\n" + \
        "\n".join(found)


def imported_from(tree: ast.Module, name: str) -> list[str]:
    """The modules ``tree`` imports ``name`` from."""
    return [node.module for node in tree.body if isinstance(node, ast.ImportFrom)
            and node.module and any((a.asname or a.name) == name for a in node.names)]
