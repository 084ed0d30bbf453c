"""Small dumps written by hand or by kern_mining.synth, for the dump, analyze and extract tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kern_mining.synth import GroundTruth, SynthSpec, write_capture


def synthetic(tmp: Path, spec: SynthSpec | None = None) -> tuple[Path, GroundTruth]:
    """A synthetic pid dump under tmp/capture/pid1 and its ground truth."""
    out = tmp / "capture" / "pid1"
    return out, write_capture(spec or SynthSpec(), out)


def launch(t_ns: int, symbol: str = "k", grid: int = 1, params: object = None) -> dict[str, object]:
    """One launches.jsonl record."""
    return {
        "t_ns": t_ns,
        "symbol": symbol,
        "module": 1,
        "grid": [grid, 1, 1],
        "block": [128, 1, 1],
        "shared_mem": 0,
        "cluster": None,
        "params": params,
    }


def write_dump(
    path: Path, launches: list[dict[str, object]], cubins: dict[int, bytes] | None = None
) -> Path:
    """A dump dir with these launches and these module files (module 1 by default)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in launches))
    cubins = {1: b"cubin one"} if cubins is None else cubins
    lines: list[str] = []
    for ident, blob in cubins.items():
        (path / f"module_{ident}.cubin").write_bytes(blob)
        record = {
            "id": ident,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "bytes": len(blob),
            "functions": ["k"],
        }
        lines.append(json.dumps(record) + "\n")
    (path / "modules.jsonl").write_text("".join(lines))
    return path
