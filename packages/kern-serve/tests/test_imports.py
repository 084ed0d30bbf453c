"""Which way kern_serve's imports point: the kern packages below it (kern_runtime, kern_pool,
kern_manifest), never kern_cli, a model provider or torch; the HTTP stack at the top of
`kern_serve.app` only, so `import kern_serve` works without the `http` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.source_imports import imported_modules

SRC = Path(__file__).resolve().parents[1] / "src" / "kern_serve"
NEVER = ("kern_cli", "kern_qwen3", "kern_interp", "torch", "transformers", "cupy")
HTTP = ("starlette", "uvicorn")


def test_no_module_imports_the_cli_a_provider_or_torch() -> None:
    modules = sorted(SRC.glob("*.py"))
    assert len(modules) > 5
    found = {f"{p.name}: {n}" for p in modules for n in imported_modules(p) if n.split(".")[0] in NEVER}
    assert not found


def test_only_the_app_imports_the_http_stack_at_its_top() -> None:
    found = {p.name for p in SRC.glob("*.py")
             if any(n.split(".")[0] in HTTP for n in imported_modules(p, top_only=True))}
    assert found == {"app.py"}
    code = "import sys, kern_serve; print(sorted(k for k in sys.modules if k.startswith(('starlette', 'uvicorn'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
