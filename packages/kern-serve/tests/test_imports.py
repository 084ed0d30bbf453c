"""Which way kern_serve's imports point: the kern packages below it (kern_runtime, kern_pool,
kern_manifest), never kern_cli, a model provider or torch; the HTTP stack at the top of
`kern_serve.app` only, so `import kern_serve` works without the `http` extra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kern_serve"
NEVER = ("kern_cli", "kern_qwen3", "kern_interp", "torch", "transformers", "cupy")
HTTP = ("starlette", "uvicorn")


def _imports(path: Path, *, top_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names.add(node.module)
    return names


def test_no_module_imports_the_cli_a_provider_or_torch() -> None:
    modules = sorted(SRC.glob("*.py"))
    assert len(modules) > 5
    found = {f"{p.name}: {n}" for p in modules for n in _imports(p, top_only=False) if n.split(".")[0] in NEVER}
    assert not found


def test_only_the_app_imports_the_http_stack_at_its_top() -> None:
    found = {p.name for p in SRC.glob("*.py") if any(n.split(".")[0] in HTTP for n in _imports(p, top_only=True))}
    assert found == {"app.py"}
    code = "import sys, kern_serve; print(sorted(k for k in sys.modules if k.startswith(('starlette', 'uvicorn'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
