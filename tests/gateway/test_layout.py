"""The gateway's layout: small modules (one concern each) and no import cycle between them.

The import graph is read from the source (module-level imports; those under ``if TYPE_CHECKING:`` and inside
functions are not edges, since they run after every module has loaded), so a cycle fails here however the
modules happen to be imported at run time. A fresh interpreter then imports every module, each one first.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fleetserve.gateway

ROOT = Path(fleetserve.gateway.__file__).parent
PACKAGE = "fleetserve.gateway"
MAX_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path) -> set[str]:
    """Gateway modules ``path`` imports when it loads."""
    found: set[str] = set()
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If) and not _type_checking(node):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            body.extend(node.body + node.orelse + node.finalbody)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES}


def test_no_gateway_module_is_over_the_size_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_gateway_modules_import_no_cycle() -> None:
    graph = {name: imports(path) for name, path in MODULES.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(name):], name]))
        if name in done:
            return
        for dependency in sorted(graph[name]):
            visit(dependency, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert "fleetserve.gateway.forward.core" in graph["fleetserve.gateway.forward.http"]  # the graph is read


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n" \
             "    for loaded in [m for m in sys.modules if m.startswith('fleetserve')]:\n" \
             "        del sys.modules[loaded]\n" \
             "    importlib.import_module(name)\n"
    done = subprocess.run([sys.executable, "-c", script, *MODULES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
