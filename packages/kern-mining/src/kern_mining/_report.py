"""The readable report of an Analysis."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kern_mining.analyze import Analysis, Site

__all__ = ["render"]

SYMBOL_WIDTH = 60


def _short(symbol: str) -> str:
    return symbol if len(symbol) <= SYMBOL_WIDTH else symbol[: SYMBOL_WIDTH - 3] + "..."


def _site_line(s: Site) -> str:
    grid = ", ".join(g.render() for g in s.grid)
    scalars = " ".join(f"p{i}={f.render()}" for i, f in s.scalars if f.form != "const")
    classes = Counter(c or "undecided" for _, c in s.pointers)
    pointers = " ".join(f"{k}:{v}" for k, v in sorted(classes.items()))
    return f"  {_short(s.symbol):<{SYMBOL_WIDTH}} #{s.ordinal:<3} grid=[{grid}] {scalars} {pointers}".rstrip()


def render(a: Analysis) -> str:
    """The report as text: windows, forwards, tokens reference, sites, ABI census, open questions."""
    lines = [f"dump {a.dump}: {a.launches} launches; core kernel {_short(a.core)}"]
    forwards = a.forwards
    lines.append(
        f"{len(a.windows)} request windows, {len(forwards)} forwards ({len(a.skipped_windows)} windows without a forward skipped)"
    )
    for n, w in enumerate(a.windows):
        tokens = ", ".join("?" if f.tokens is None else str(f.tokens) for f in w.forwards)
        lines.append(
            f"  window {n}: launches {w.first}..{w.last}, {len(w.forwards)} forwards, tokens [{tokens}]"
        )
    ref = a.tokens_reference
    if ref is None:
        lines.append("tokens reference: none")
    else:
        lines.append(
            f"tokens reference: {_short(ref.symbol)} #{ref.ordinal}, grid.x/{ref.scale} (of {ref.candidates} candidates; "
            f"{ref.unfit} unfit, {ref.underdetermined} underdetermined)"
        )
    forms = Counter(f.form for s in a.sites for f in [*s.grid, *(x for _, x in s.scalars)])
    lines.append(
        f"{len(a.sites)} call sites; fits: "
        + ", ".join(f"{k} {v}" for k, v in sorted(forms.items()))
    )
    lines += [
        _site_line(s)
        for s in a.sites
        if any(g.form != "const" for g in s.grid) or any(f.form != "const" for _, f in s.scalars)
    ]
    layouts = Counter(e.layout for e in a.abi)
    lines.append(
        "ABI census: " + ", ".join(f"{k} {v}" for k, v in sorted(layouts.items())) + " symbols"
    )
    for e in a.abi:
        shape = (
            f"{e.params} params, largest {e.max_param_size} B, {e.pointer_params} pointers"
            if e.layout == "flat"
            else ""
        )
        lines.append(
            f"  {e.layout:<8} {_short(e.symbol):<{SYMBOL_WIDTH}} x{e.launches} {shape}".rstrip()
        )
    lines += [f"note: {n}" for n in a.notes]
    lines += [f"undecided: {n}" for n in a.undecided]
    return "\n".join(lines)
