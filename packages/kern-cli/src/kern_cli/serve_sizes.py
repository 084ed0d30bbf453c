"""The sizes `kern serve` and `kern bench serve` ask of an engine, checked before anything is
allocated (docs/serve.md, Flags): one rule per size, in one place.

- `--capacity` must make a pool (kern_runtime.sequences.pool_config_for, the GPU runtime's own
  sizing; kern_pool refuses a budget past `CHUNKS_MAX` chunks);
- `--rows` at most the pool's pages: every running request holds at least one page;
- `--host-bytes` 0 (no host tier) or at least one KV page: a smaller tier holds nothing;
- the bytes that go to host RAM at most the RAM available (/proc/meminfo's MemAvailable, else the
  physical RAM): the host tier (`--host-bytes`, pinned host memory on the GPU), or all that a
  factory says it takes through its optional `ram(spec)` (the CPU backend: its KV pool, host tier
  and weights as float32). The GPU's own memory is checked by the runtime when it loads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kern_cli.run import RunError
from kern_cli.serve_api import shown

if TYPE_CHECKING:
    from kern_runtime.serving import EngineSpec

__all__ = ["SizeError", "available_ram", "check_sizes", "size_text"]


class SizeError(RunError):
    """A size flag the machine or the model cannot hold."""


def size_text(n: int) -> str:
    """`n` bytes in binary units (`1.5 GiB`)."""
    if n.bit_length() > 70:
        return "over 1024 EiB"
    value, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def available_ram(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Bytes of RAM a new allocation may take: MemAvailable where the kernel says, else the
    physical RAM."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_sizes(spec: EngineSpec, manifest: Mapping[str, Any], factory: Any, backend: str, ram: int | None = None) -> None:
    """Refuse the sizes of `spec` (a kern_runtime.serving.EngineSpec of `manifest`) that the
    machine or the model cannot hold, before `factory` is called: the host tier's page, host RAM,
    the pool, the rows.

    Raises:
        SizeError: one line naming the flag and what it may be.
    """
    import kern_runtime as kr

    roles = kr.serving_roles(manifest)
    _check_host(spec, manifest, roles.page_tokens)
    _check_ram(_ram_asks(spec, factory), backend, available_ram() if ram is None else ram)
    _check_pool(spec)
    _check_rows(spec, roles.page_tokens)


def _check_host(spec: EngineSpec, manifest: Mapping[str, Any], page_tokens: int) -> None:
    page = page_tokens * sum(s.get("bytes_per_token") or 0 for s in manifest["states"].values())
    if 0 < spec.host_bytes < page:
        raise SizeError(f"--host-bytes {spec.host_bytes} holds no KV page of {page} bytes: pass 0 (no host tier) "
                        f"or at least {page}")


def _ram_asks(spec: EngineSpec, factory: Any) -> dict[str, int]:
    ram: Any = getattr(factory, "ram", None)
    if not callable(ram):
        return {"the host tier": spec.host_bytes}
    asks = cast(Mapping[str, int], ram(spec))
    return {str(what): int(n) for what, n in asks.items()}


def _check_ram(asks: Mapping[str, int], backend: str, ram: int) -> None:
    total = sum(asks.values())
    if total <= ram:
        return
    parts = ", ".join(f"{what} {size_text(n)}" for what, n in asks.items() if n)
    raise SizeError(f"backend {shown(backend)} needs {size_text(total)} of RAM ({parts}); this machine has "
                    f"{size_text(ram)} available: pass a smaller --capacity or --host-bytes")


def _check_pool(spec: EngineSpec) -> None:
    import kern_runtime as kr
    from kern_manifest import parse_manifest
    from kern_runtime.sequences import pool_config_for

    manifest = parse_manifest(Path(spec.manifest).read_bytes())
    try:
        pool_config_for(manifest, kr.Capacity(tokens=spec.tokens, seqs=spec.seqs))
    except kr.ApiError as exc:
        raise SizeError(f"--capacity {shown(spec.tokens)}: {exc}") from None


def _check_rows(spec: EngineSpec, page_tokens: int) -> None:
    pages = -(-spec.tokens // page_tokens)  # NOTE: the engines round the pool up to whole pages
    if spec.seqs > pages:
        raise SizeError(f"--rows {shown(spec.seqs)}: a pool of {spec.tokens} tokens has {pages} pages of "
                        f"{page_tokens} tokens and a running request holds at least one: pass --rows {pages} or "
                        "less, or a larger --capacity")
