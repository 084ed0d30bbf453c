"""The head program: after the last prefill chunk, what the first generated token still needs.

The chunk program runs every prompt row through the last layer's q/k norm, rope and KV write, so
the last row's KV, its normed and rotated q (in `qkv`) and its residual (in `h`) are there when
the chunk ends. `head` (a one-row graph program, `{"groups": 1, "rows": 1}`) then runs:

- when device-fed, the `start` copies (the staged last prompt token, its position, slot and the
  sequence length into the step carries);
- two row gathers (`kern_embed` with the input `head_row`, fill `span_at`: the last prompt token's
  row of the chunk) of that row of `h` and `qkv` into the one-row buffers `head_h` / `head_qkv`;
- the decode program's own calls from the last layer's attention on, reading `head_h` for `h` and
  `head_qkv` for `qkv`: decode attention over the sequence, o, the MLP, the final norm, lm_head,
  the argmax into `next_token` and (device-fed) `kern_decode_advance`, so the step carries then
  hold the first token at position n, as after a decode step.

`h` and `qkv` become `carry` buffers: the head reads what the chunk program left in them.
"""

from __future__ import annotations

from collections.abc import Mapping

from kern_qwen3.fragments import Json, buf, call, i32
from kern_qwen3.programs import start_calls
from kern_qwen3.shape import Qwen3Shape

__all__ = ["HEAD_BUFFERS", "HEAD_PROGRAM", "HEAD_ROW", "add_head", "head_calls"]

HEAD_PROGRAM = "head"
HEAD_ROW = "head_row"
HEAD_BUFFERS: dict[str, str] = {"h": "head_h", "qkv": "head_qkv"}
"""A chunk workspace the head reads a row of -> the head's one-row copy of it."""
_ATTENTION_OPS = ("attn_decode", "attn_decode_fused")
"""The decode attentions the head continues from (they read q from `qkv`, K/V from the pages)."""


def _renamed(c: Json, names: Mapping[str, str]) -> Json:
    args = [{**a, "buf": names[a["buf"]]} if a.get("buf") in names else a for a in c["args"]]
    return {**c, "args": args}


def head_calls(s: Qwen3Shape, decode: list[Json], feed: str) -> list[Json] | None:
    """The head's calls over the final `decode` calls, or None when the decode program has no
    attention call of the last layer that reads the q the chunk program rotated (a rewrite that
    moved the q/k norm into the attention)."""
    label = f"l{s.layers - 1}.attn"
    at = next((i for i, c in enumerate(decode) if c.get("label") == label), None)
    if at is None or decode[at]["op"].removesuffix(".pdl") not in _ATTENTION_OPS:
        return None
    gathers = [call("head.h", "embed", buf(HEAD_ROW), buf("h"), buf(HEAD_BUFFERS["h"]), i32(s.hidden)),
               call("head.qkv", "embed", buf(HEAD_ROW), buf("qkv"), buf(HEAD_BUFFERS["qkv"]), i32(s.qkv_rows))]
    return [*(start_calls() if feed == "device" else []), *gathers,
            *(_renamed(c, HEAD_BUFFERS) for c in decode[at:])]


def _head_buffers(s: Qwen3Shape, buffers: Json) -> Json:
    """`buffers` with `h` and `qkv` as carries, `head_row` after the block table and the one-row
    copies after the workspaces."""
    out: Json = {}
    for name, spec in buffers.items():
        out[name] = {**spec, "kind": "carry"} if name in HEAD_BUFFERS else spec
        if name == "block_table":
            out[HEAD_ROW] = {"dtype": "i64", "shape": [1], "kind": "input", "fill": "span_at",
                             "domain": {"index_into": "h"}}
        if name == "act":
            out[HEAD_BUFFERS["h"]] = {"dtype": "bf16", "shape": [1, s.hidden], "kind": "workspace"}
            out[HEAD_BUFFERS["qkv"]] = {"dtype": "bf16", "shape": [1, s.qkv_rows], "kind": "workspace"}
    return out


def add_head(manifest: Json, s: Qwen3Shape, feed: str) -> bool:
    """Adds the head program and its buffers to a generated manifest (in place), after the
    passes; returns whether it could (see `head_calls`)."""
    calls = head_calls(s, manifest["programs"]["decode"]["calls"], feed)
    if calls is None:
        return False
    manifest["buffers"] = _head_buffers(s, manifest["buffers"])
    manifest["programs"][HEAD_PROGRAM] = {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": calls}
    return True
