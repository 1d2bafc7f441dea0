"""The product stands alone: nothing under proxy/ imports the benchmarks, the tests, or a dev-only
tool, at module level or lazily inside a function, so the wheel (proxy/ alone) runs everything it
ships (``radixgate demo`` and ``python -m proxy.sim`` included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"
# Top-level names the product must never import: the benchmarks beside it, the tests, and
# grpcio-tools (dev extra: it generates proxy/_proto, it is not installed with the wheel).
FORBIDDEN = frozenset({"loadtests", "tests", "grpc_tools"})


def imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the tree, function bodies included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def forbidden_imports(root: Path) -> list[str]:
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for line, module in imported_modules(ast.parse(path.read_text())):
            if module.split(".")[0] in FORBIDDEN:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    return bad


def test_the_walk_sees_lazy_imports_inside_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "proxy"
    pkg.mkdir()
    (pkg / "m.py").write_text("import os\n\ndef f():\n    from loadtests.bench import send\n    import tests.x\n")
    assert forbidden_imports(pkg) == ["proxy/m.py:4 imports loadtests.bench", "proxy/m.py:5 imports tests.x"]


def test_the_product_imports_no_benchmark_test_or_dev_tool() -> None:
    assert (PACKAGE / "sim" / "server.py").is_file() and (PACKAGE / "loadgen" / "client.py").is_file()
    assert forbidden_imports(PACKAGE) == []


def test_the_product_uses_no_relative_imports() -> None:
    # Absolute imports are what test_import_cycles walks; a relative one would hide an edge from it.
    relative = [
        f"{p.relative_to(PACKAGE.parent)}:{n.lineno}"
        for p in sorted(PACKAGE.rglob("*.py")) if "_proto" not in p.parts
        for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ImportFrom) and n.level
    ]
    assert relative == []
