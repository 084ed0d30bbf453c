"""kern_cli knows model families only through `kern_runtime.providers`: no module of its source
imports a provider (kern_qwen3), and the CLI's model knowledge comes from the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.source_imports import imported_modules

import kern_cli.chat as chat
from kern_cli import options
from kern_runtime.providers import find
from kern_serve import conversation

SRC = Path(__file__).resolve().parents[1] / "src" / "kern_cli"
PROVIDERS = ("kern_qwen3",)


def test_no_kern_cli_module_imports_a_provider() -> None:
    modules = sorted(SRC.glob("*.py"))
    assert len(modules) > 10
    found = {f"{p.name}: {name}" for p in modules for name in imported_modules(p)
             if name.split(".")[0] in PROVIDERS}
    assert not found


def test_kern_cli_does_not_depend_on_a_provider() -> None:
    import tomllib

    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.split("[")[0].replace("-", "_") in PROVIDERS]


def test_the_registry_gives_the_chat_text_and_stops_of_a_qwen3_manifest() -> None:
    class Tok:
        def encode(self, text: str) -> list[int]:
            return [{"<|im_end|>": 7, "<|endoftext|>": 8}.get(text, 1)]

        def decode(self, ids: list[int]) -> str:
            return ""

    conv = conversation(Tok(), find({"model": "qwen3-tiny"}))
    assert conv.stop == frozenset({7, 8}) and conv.template is not None
    assert conv.template([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user\nhi<|im_end|>")
    assert find({"model": "Qwen3-4B"}).name == "qwen3"


def test_an_unknown_family_is_one_line_where_the_cli_needs_one() -> None:
    with pytest.raises(options.RunError, match=r"^no chat template: no installed model provider knows model 'llama' "
                       r"\(installed families: qwen3\) \(drop --chat\)$"):
        chat._provider({"model": "llama"})  # pyright: ignore[reportPrivateUsage]


def test_each_command_module_imports_alone_without_a_cycle_or_a_provider() -> None:
    import subprocess
    import sys

    code = ("import sys, importlib; m = sys.argv[1]; importlib.import_module(m); "
            "print(sorted(k for k in sys.modules if k.startswith(('kern_cli.', 'kern_qwen3'))))")
    for name in ("run", "chat", "serve", "bench_cmd"):
        out = subprocess.run([sys.executable, "-c", code, f"kern_cli.{name}"], capture_output=True, text=True,
                             check=True).stdout
        assert "kern_qwen3" not in out, (name, out)
        if name == "run":
            assert "kern_cli.chat" not in out, out
        if name == "chat":
            assert "kern_cli.run" not in out, (name, out)
