"""docs/runtime.md's "The public API" lists exactly `kern_runtime.__all__`.

The section's tables name one thing per row in their first column: a bare identifier is a
top-level name (it must be in `__all__`, and every name of `__all__` must be one), a dotted
`kern_runtime.x` is a submodule imported by path (it must import).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import kern_runtime

REPO = Path(__file__).resolve().parents[3]
HEADING = "## The public API"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOTTED = re.compile(r"kern_runtime(\.[A-Za-z_][A-Za-z0-9_]*)+")


def api_section(text: str) -> str:
    """The lines after HEADING up to the next `## ` heading."""
    lines = text.splitlines()
    assert lines.count(HEADING) == 1, f"docs/runtime.md needs one {HEADING!r} heading"
    start = lines.index(HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end])


def first_cells(section: str) -> list[str]:
    """The first column's backticked text of every table row (header and rule rows skipped)."""
    names: list[str] = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cell = line.split("|")[1].strip()
        match = re.fullmatch(r"`([^`]+)`", cell)
        if match is not None:
            names.append(match.group(1))
    return names


def listed() -> list[str]:
    return first_cells(api_section((REPO / "docs" / "runtime.md").read_text()))


def test_every_name_of_all_is_listed_and_every_listed_name_is_in_all() -> None:
    cells = listed()
    names = [c for c in cells if IDENTIFIER.fullmatch(c)]
    exported = set(kern_runtime.__all__)
    missing = sorted(exported - set(names))
    stale = sorted(set(names) - exported)
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not missing, f"in kern_runtime.__all__ but not listed in {HEADING}: {missing}"
    assert not stale, f"listed in {HEADING} but not in kern_runtime.__all__: {stale}"
    assert not twice, f"listed twice in {HEADING}: {twice}"


def test_every_first_cell_is_a_name_or_a_submodule_that_imports() -> None:
    cells = listed()
    odd = [c for c in cells if not IDENTIFIER.fullmatch(c) and not DOTTED.fullmatch(c)]
    assert not odd, f"first cells in {HEADING} that are neither a name nor kern_runtime.x: {odd}"
    modules = [c for c in cells if DOTTED.fullmatch(c)]
    assert modules, f"{HEADING} lists no submodules"
    for module in modules:
        importlib.import_module(module)


def test_the_bench_instrument_named_there_exists() -> None:
    from kern_runtime.bench.driver import Driver

    assert "`bench.driver.Driver`" in api_section((REPO / "docs" / "runtime.md").read_text())
    assert isinstance(Driver, type)
