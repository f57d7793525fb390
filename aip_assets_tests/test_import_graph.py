"""The package's imports flow one way: no module imports, directly or through others, a module that imports it.

The layer order itself (cli > jobs/assets > pipeline > metrics > models > config > util) is import-linter's
contract in pyproject.toml, checked by `lint-imports` in `.ci/run`; this test checks what no layer contract
can: that there is no cycle at all, inside a layer too, lazy imports in functions included (they run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

import aip_assets


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
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
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_planted_cycle_and_nothing_else():
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c", "p.d"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    graph.add_import(importer="p.d", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_no_module_of_the_package_is_in_an_import_cycle():
    graph = grimp.build_graph("aip_assets", exclude_type_checking_imports=True)
    cycles = _cycles(graph)
    assert cycles == [], "import cycles (each a set of modules that import each other):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_model_layer_has_no_cycle_even_through_type_checking_imports():
    """Inside models/ not even an import made only for the type checker (``if TYPE_CHECKING:``)
    closes a cycle: a module the client calls (the batch runner, the retries) names what it asks
    of the client as a protocol instead of importing the module that imports it."""
    graph = grimp.build_graph("aip_assets", exclude_type_checking_imports=False)
    # budget.py imports the journal only for the type checker: the graph counts such imports
    assert graph.direct_import_exists(importer="aip_assets.models.budget", imported="aip_assets.models.journal")
    cycles = [c for c in _cycles(graph) if any(m.startswith("aip_assets.models.") for m in c)]
    assert cycles == [], "import cycles through models/ (TYPE_CHECKING imports counted):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_importing_the_run_spec_loads_no_metric_and_no_http_stack():
    code = (
        "import sys, aip_assets.runspec\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('aip_assets.', 'aiohttp', 'httpx')))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "aip_assets.runspec" in loaded
    heavy = [m for m in loaded if m.startswith(("aiohttp", "httpx", "aip_assets.models.client", "aip_assets.pipeline"))]
    assert heavy == []
    metric_modules = [m for m in loaded if m.startswith("aip_assets.metrics.") and m.count(".") >= 2]
    assert all(m.split(".")[2] in ("base", "registry") for m in metric_modules), metric_modules


MAX_LINES = 600  # issue 39: a module a newcomer can hold in their head


def test_every_module_of_the_package_is_at_most_600_lines():
    package = Path(aip_assets.__file__).parent
    sizes = {p.relative_to(package.parent).as_posix(): len(p.read_text().splitlines()) for p in package.rglob("*.py")}
    assert len(sizes) > 100  # the whole package was walked, not an empty folder
    too_big = {path: n for path, n in sorted(sizes.items()) if n > MAX_LINES}
    assert too_big == {}, f"modules over {MAX_LINES} lines (split them where a reader would look): {too_big}"
