"""The launch shape each GEMV entry of a .cu source declares (its launch bounds and the device
template it calls), to check kern_qwen3's and kern_lab's GEMV tables against gemv.cu and
gemv_alt.cu."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kern_qwen3 import GemvEntry, Layout

_HEAD = r"__launch_bounds__\(([^)]*)\)\s*(kern_gemv_bf16\w*)\([^)]*\)\s*\{\s*"
_COLUMNS = re.compile(_HEAD + r"gemv(_seq)?<(\w+), (\w+), (\w+), (\w+)(?:, (GEMV_\w+))?>")
_BAND = re.compile(_HEAD + r"gemv_(?:band|deep)<(\d+), (?:\d+, )+(GEMV_\w+)>")
_PREFETCH = re.compile(_HEAD + r"with_rows\(rows, \[&\]\(auto r\) \{ gemv_p4_rows<(GEMV_\w+),")
_STREAM = re.compile(_HEAD + r"gemv_tma<(GEMV_\w+)>")


def _int(token: str, macros: Mapping[str, int]) -> int:
    return macros[token] if token in macros else int(token)


def _bounds(text: str, macros: Mapping[str, int]) -> tuple[int, int]:
    """(threads, blocks per SM or 0) of a `__launch_bounds__` argument list."""
    parts = [p.strip() for p in text.split(",")]
    threads = parts[0]
    if threads.endswith("* 32"):
        threads_n = _int(threads.removesuffix("* 32").strip(), macros) * 32
    else:
        threads_n = _int(threads, macros)
    return threads_n, int(parts[1]) if len(parts) > 1 else 0


def _columns(text: str, macros: Mapping[str, int]) -> dict[str, GemvEntry]:
    out: dict[str, GemvEntry] = {}
    for bounds, entry, seq, warps, cols, _unroll, split, epi in _COLUMNS.findall(text):
        threads, _ = _bounds(bounds, macros)
        w, c, s = (_int(v, macros) for v in (warps, cols, split))
        assert threads == w * 32, entry
        columns = w // s * c  # gemv_seq's second argument: columns a group streams in turn
        out[entry] = GemvEntry(Layout.COLUMNS, threads, columns=columns, silu=epi == "GEMV_SILU")
        assert not seq or not epi, entry
    return out


_DEFINE = re.compile(r"^#define (\w+) (\d+)$|^constexpr int (\w+) = (\d+);", re.MULTILINE)


def source_table(text: str) -> dict[str, GemvEntry]:
    """Entry -> the GemvEntry its source declares: COLUMNS from `gemv` / `gemv_seq`'s configuration,
    BAND from the block's split and its launch bounds' blocks per SM, PREFETCH and STREAM with
    their threads (the integer `#define`s and `constexpr int`s of `text` resolve names in the
    arguments). The accumulating entry (no decode GEMM) is not listed."""
    macros = {a or c: int(b or d) for a, b, c, d in _DEFINE.findall(text)}
    out = {e: v for e, v in _columns(text, macros).items() if "_acc" not in e}
    for bounds, entry, split, epi in _BAND.findall(text):
        threads, per_sm = _bounds(bounds, macros)
        assert threads == 32 * int(split), entry
        out[entry] = GemvEntry(Layout.BAND, threads, per_sm=per_sm, silu=epi == "GEMV_SILU")
    for bounds, entry, epi in _PREFETCH.findall(text):
        out[entry] = GemvEntry(Layout.PREFETCH, _bounds(bounds, macros)[0], silu=epi == "GEMV_SILU")
    for bounds, entry, epi in _STREAM.findall(text):
        out[entry] = GemvEntry(Layout.STREAM, _bounds(bounds, macros)[0], silu=epi == "GEMV_SILU")
    return out
