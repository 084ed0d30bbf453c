"""The modules a Python source file imports, read with `ast` (nothing is run), for the tests that
hold a package to which way its imports point (packages/kern-serve/tests/test_imports.py,
packages/kern-cli/tests/test_providers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["imported_modules"]


def imported_modules(path: Path, *, top_only: bool = False) -> set[str]:
    """The absolute module names the file at `path` imports: `a.b` for `import a.b` and for
    `from a.b import c` (relative imports are left out). Every import in the file, inside
    functions included; with `top_only`, those of its top-level statements only."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names.add(node.module)
    return names
