"""`kern bench`'s report: floors from measured yardsticks, the peer's rows, the per-call breakdown,
the text table, the JSON and the plot. Everything here is pure (numbers in, text or files out) and
runs on any machine; the plot needs matplotlib (the `plot` extra) and is skipped without it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BREAKDOWN_COLUMNS",
    "CallTime",
    "Report",
    "Row",
    "breakdown_markdown",
    "breakdown_table",
    "call_kinds",
    "checkpoint_config",
    "compute_floor_rows",
    "context_of",
    "decode_series",
    "floor_rows",
    "peer_rows",
    "plot",
    "row",
    "table",
    "write_report",
]

Row = dict[str, Any]
CallTime = tuple[str, float]
"""(call label, GPU milliseconds) of one call of one eager run."""
BREAKDOWN_COLUMNS = ("call", "calls/step", "us each", "us/step", "share")


def row(name: str, value: float, unit: str, target: float | None = None, peer: str = "") -> Row:
    """A row of the bench convention: name, value, unit, target, peer."""
    return {"name": name, "value": round(float(value), 4), "unit": unit, "target": target, "peer": peer}


def table(rows: Sequence[Row]) -> str:
    """Rows as an aligned text table."""
    keys = ["name", "value", "unit", "target", "peer"]
    cells = [["" if r.get(k) is None else str(r.get(k)) for k in keys] for r in rows]
    widths = [max([len(k), *(len(c[i]) for c in cells)]) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cells_row, widths, strict=True)).rstrip() for cells_row in cells]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Floors.


def floor_rows(weight_bytes: int, kv_bytes_per_token: int, contexts: Sequence[int], copy_bytes_per_s: float) -> list[Row]:
    """The copy rate and, per context, the bandwidth floor of a decode step: the weight bytes and
    the KV bytes of that many tokens, each read once, at the measured copy rate."""
    rows = [row("copy_bandwidth_rw", copy_bytes_per_s / 1e12, "TB/s", peer="device-to-device copy, read + write"),
            row("kv_bytes_per_token", kv_bytes_per_token, "B")]
    for c in contexts:
        nbytes = weight_bytes + c * kv_bytes_per_token
        rows.append(row(f"bandwidth_floor_ms_per_step@ctx{c}", nbytes / copy_bytes_per_s * 1e3, "ms",
                        peer=f"({weight_bytes / 1e9:.3f} GB weights + {c * kv_bytes_per_token / 1e9:.3f} GB KV) / copy rate"))
    return rows


def compute_floor_rows(prefill_flops: Callable[[Mapping[str, Any], int], float], config: Mapping[str, Any],
                       prefills: Sequence[int], gemm_flops_per_s: float) -> list[Row]:
    """The measured bf16 GEMM rate and, per prefill, its FLOPs at that rate (`prefill_flops`: the
    model family's count from the checkpoint's config.json, `Provider.prefill_flops`)."""
    rows = [row("gemm_rate_bf16", gemm_flops_per_s / 1e12, "TFLOP/s", peer="cublasLt bf16 8192^3, one graph")]
    for n in prefills:
        flops = prefill_flops(config, n)
        rows.append(row(f"compute_floor_ms@{n}", flops / gemm_flops_per_s * 1e3, "ms",
                        peer=f"{flops / 1e12:.2f} TFLOP / GEMM rate"))
    return rows


def checkpoint_config(weights: Sequence[Path]) -> dict[str, Any] | None:
    """The config.json of a checkpoint given as a directory or its files (beside the first file);
    None when there is none or it is not a JSON object."""
    if not weights:
        return None
    first = weights[0]
    path = (first if first.is_dir() else first.parent) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------------------------
# The peer.

_PEER_ROWS = (("fed_ms_per_token", "peer_decode_gpu_ms_per_step@ctx{}", "decode_gpu_ms_per_step@ctx{}"),
              ("fixed_ms_per_token", "peer_decode_gpu_fixed_ms_per_step@ctx{}", "decode_gpu_fixed_ms_per_step@ctx{}"))


def peer_rows(result: Mapping[str, Any], kern: list[Row]) -> list[Row]:
    """The peer's rows from its JSON result (kern_peer's format), and its value written into the
    `peer` column of kern's matching rows (in place)."""
    by_name = {r["name"]: r for r in kern}
    label = str(result.get("peer", "peer"))
    rows = [row("peer_compile_s", float(result["compile_s"]), "s", peer=label)]
    for d in result["decode"]:
        c = int(d["context"])
        for key, name, ours in _PEER_ROWS:
            rows.append(row(name.format(c), float(d[key]), "ms"))
            _note(by_name.get(ours.format(c)), float(d[key]), "ms")
    for p in result["prefill"]:
        n = int(p["tokens"])
        rows.append(row(f"peer_prefill_ms@{n}", float(p["ms"]), "ms"))
        _note(by_name.get(f"prefill_ms@{n}"), float(p["ms"]), "ms")
    return rows


def _note(r: Row | None, value: float, unit: str) -> None:
    if r is not None:
        r["peer"] = "; ".join(x for x in (f"torch peer {value:.4g} {unit}", r.get("peer") or "") if x)


# --------------------------------------------------------------------------------------------
# The per-call breakdown.


def call_kinds(runs: Sequence[Sequence[CallTime]]) -> list[tuple[str, float, float]]:
    """Per call kind (the label without its layer prefix, `l3.qkv` -> `qkv`): calls per step and
    microseconds per step, the mean over `runs` (each one eager run of the step), most first."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for run in runs:
        for label, ms in run:
            kind = re.sub(r"^l\d+\.", "", label)
            sums[kind] = sums.get(kind, 0.0) + ms * 1e3
            counts[kind] = counts.get(kind, 0) + 1
    n = max(len(runs), 1)
    return sorted(((k, counts[k] / n, sums[k] / n) for k in sums), key=lambda t: -t[2])


def _breakdown_cells(runs: Sequence[Sequence[CallTime]]) -> tuple[list[list[str]], float]:
    kinds = call_kinds(runs)
    total = sum(us for _k, _n, us in kinds)
    cells = [[k, f"{n:g}", f"{us / n:.2f}", f"{us:.1f}", f"{us / total:.1%}" if total else ""] for k, n, us in kinds]
    return cells, total


def breakdown_table(context: int, runs: Sequence[Sequence[CallTime]], replay_ms: float | None) -> str:
    """A text table of `call_kinds` at one context, with the eager sum beside the step's replay."""
    cells, total = _breakdown_cells(runs)
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(BREAKDOWN_COLUMNS)]
    lines = [f"decode step at context {context}: {len(runs)} eager runs, calls timed apart " + _totals(total, replay_ms)]
    lines.append("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(BREAKDOWN_COLUMNS, widths, strict=True))))
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cs, widths, strict=True))) for cs in cells]
    return "\n".join(lines)


def _totals(total_us: float, replay_ms: float | None) -> str:
    if replay_ms is None:
        return f"(sum {total_us:.1f} us)"
    return (f"(sum {total_us:.1f} us; the graph replayed back to back {replay_ms * 1e3:.1f} us: "
            f"{total_us - replay_ms * 1e3:.1f} us of overlap and per-call events)")


def breakdown_markdown(context: int, runs: Sequence[Sequence[CallTime]], replay_ms: float | None) -> str:
    """The same as a markdown table (for docs/perf.md)."""
    cells, total = _breakdown_cells(runs)
    lines = [f"Context {context} {_totals(total, replay_ms)}:", "",
             "| " + " | ".join(BREAKDOWN_COLUMNS) + " |", "|" + "---|" * len(BREAKDOWN_COLUMNS)]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The plot and the files.


def context_of(name: str, stem: str) -> int | None:
    """The context of a row named `<stem>@ctx<c>`, else None."""
    m = re.fullmatch(re.escape(stem) + r"@ctx(\d+)", name)
    return int(m.group(1)) if m else None


_SERIES = (
    ("kern, tokens fed in turn", "decode_gpu_ms_per_step"),
    ("kern, fixed context", "decode_gpu_fixed_ms_per_step"),
    ("torch peer, tokens fed in turn", "peer_decode_gpu_ms_per_step"),
    ("torch peer, fixed context", "peer_decode_gpu_fixed_ms_per_step"),
    ("bandwidth floor", "bandwidth_floor_ms_per_step"),
)


def decode_series(rows: Sequence[Row]) -> list[tuple[str, list[tuple[int, float]]]]:
    """The plot's lines: (label, [(context, ms)] by context) of each series the rows have."""
    out = []
    for label, stem in _SERIES:
        points = sorted((c, float(r["value"])) for r in rows if (c := context_of(r["name"], stem)) is not None)
        if points:
            out.append((label, points))
    return out


def plot(rows: Sequence[Row], path: Path, title: str) -> str | None:
    """Draws ms/token against context (log scale) for kern, the peer and the floor into the PNG
    `path`. Returns None, or the one-line reason it drew nothing (matplotlib missing, no rows)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "no plot: matplotlib is not installed (uv sync --group plot, or pip install 'kern-cli[plot]')"
    series = decode_series(rows)
    if not series:
        return "no plot: no decode rows"
    fig = Figure(figsize=(7.5, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, points in series:
        style = "--" if label == "bandwidth floor" else "-"
        ax.plot([c for c, _ in points], [v for _, v in points], style, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("ms / token")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))
    return None


@dataclass
class Report:
    """What one `kern bench` run measured: its rows, the breakdown runs by context, the peer's
    raw result and one-line notes (what was skipped and why)."""

    rows: list[Row]
    breakdown: dict[int, list[list[CallTime]]] = field(default_factory=dict[int, list[list[CallTime]]])
    replay_ms: dict[int, float] = field(default_factory=dict[int, float])
    peer: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list[str])
    title: str = "kern bench"

    def text(self) -> str:
        """The table, then each breakdown table."""
        parts = [table(self.rows)]
        parts += [breakdown_table(c, runs, self.replay_ms.get(c)) for c, runs in sorted(self.breakdown.items())]
        return "\n\n".join(parts)

    def markdown(self) -> str:
        """The breakdown tables in markdown."""
        return "\n\n".join(breakdown_markdown(c, runs, self.replay_ms.get(c))
                           for c, runs in sorted(self.breakdown.items())) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "breakdown": {str(c): runs for c, runs in sorted(self.breakdown.items())},
                "replay_ms": {str(c): v for c, v in sorted(self.replay_ms.items())}, "peer": self.peer,
                "notes": self.notes}


def write_report(report: Report, out: Path, note: Callable[[str], None]) -> list[Path]:
    """Writes bench.json, bench.txt, breakdown.md (when there is a breakdown) and bench.png into
    `out` (created); a plot that cannot be drawn is one line through `note`. Returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "bench.json", out / "bench.txt"]
    files[0].write_text(json.dumps(report.as_json(), indent=1) + "\n")
    files[1].write_text(report.text() + "\n")
    if report.breakdown:
        files.append(out / "breakdown.md")
        files[-1].write_text(report.markdown())
    why = plot(report.rows, out / "bench.png", report.title)
    if why is None:
        files.append(out / "bench.png")
    else:
        note(why)
    return files
