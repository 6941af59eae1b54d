"""The package's shape: no import cycle between subpackages, no oversized module.

The layer order itself is checked by ``lint-imports`` (contracts in pyproject.toml);
these tests catch the two regressions it does not name directly.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = Path(__file__).resolve().parent.parent / "hlo_doctor"
MAX_LINES = 600


def _group(module: str) -> str:
    """``hlo_doctor.graph.dataflow`` -> ``hlo_doctor.graph``; top-level modules are their own group."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_subpackages() -> None:
    graph = grimp.build_graph("hlo_doctor", include_external_packages=False)
    imports = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            imports.add_edge(module, imported)
    crossing = [sorted(component) for component in nx.strongly_connected_components(imports)
                if len({_group(m) for m in component}) > 1]
    assert not crossing, f"import cycles across subpackages: {crossing}"


def test_no_module_over_the_size_limit() -> None:
    sizes = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in PACKAGE.rglob("*.py")}
    too_big = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not too_big, f"modules over {MAX_LINES} lines (split them by concept): {too_big}"
