"""kern_qwen3.tp: the TP-N manifest verifies, its collectives sit where the split needs them, and
its weight plan covers every checkpoint tensor exactly once over the ranks of group tp (split
tensors) or whole on every rank (replicated ones)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from helpers.qwen3_options import FAKE_ENTRIES, FAKE_HASHES, plan_of, verify_manifest

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG, qwen3_tensor_shapes

TINY = gen.shape_from_config(QWEN3_TINY_CONFIG)
FOUR_B = gen.shape_from_config(QWEN3_4B_CONFIG)
FAST = {"feed": "device", "fuse": True, "gemv": ("qkv", "o", "gate_up", "down"), "fold_norm": True,
        "defer_norm": True}


def _tp(shape: gen.Qwen3Shape, n: int, **kw: Any) -> dict[str, Any]:
    return gen.generate_tp(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", tp=n, plan=plan_of(**kw))


CASES = [(TINY, 1, False), (TINY, 2, False), (TINY, 2, True), (FOUR_B, 1, False), (FOUR_B, 2, True),
         (FOUR_B, 8, False)]


@pytest.mark.parametrize(("shape", "n", "fast"), CASES,
                         ids=[f"{s.layers}l-tp{n}-{'fast' if f else 'plain'}" for s, n, f in CASES])
def test_tp_manifest_verifies(shape: gen.Qwen3Shape, n: int, fast: bool) -> None:
    m = _tp(shape, n, **(FAST if fast else {}))
    verify_manifest(m)
    assert m["topology"] == {"groups": {"tp": n}}
    assert m["states"]["kv"]["bytes_per_token"] * n == shape.kv_bytes_per_token


def _calls(m: dict[str, Any], program: str) -> list[dict[str, Any]]:
    return m["programs"][program]["calls"]


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
def test_an_allreduce_follows_every_o_and_down(fast: bool) -> None:
    m = _tp(FOUR_B, 2, **(FAST if fast else {}))
    for program, layers in (("decode", FOUR_B.layers), ("prefill", FOUR_B.layers - 1)):
        calls = _calls(m, program)
        labels = [c["label"] for c in calls]
        reduced = [labels[i - 1] for i, c in enumerate(calls) if c["op"] == "allreduce_bf16"]
        assert reduced == [f"l{i}.{g}" for i in range(layers) for g in ("o", "down")]
        for c in calls:
            if c["op"] == "allreduce_bf16":
                assert c["args"][:2] == [{"buf": "y"}, {"buf": "y"}]
        count = next(c for c in calls if c["op"] == "allreduce_bf16")["args"][2]
        assert count == ({"i64": FOUR_B.hidden} if program == "decode"
                         else {"expr": {"mul": ["tokens", FOUR_B.hidden]}})


def test_lm_head_band_is_gathered_before_the_argmax() -> None:
    m = _tp(FOUR_B, 4)
    labels = [c["label"] for c in _calls(m, "decode")]
    at = labels.index("lm_head")
    assert labels[at:at + 3] == ["lm_head", "lm_head.allgather", "argmax"]
    gemm, gather = _calls(m, "decode")[at:at + 2]
    assert gemm["args"][1:5] == [{"buf": "lm_head"}, {"buf": "logits_part"}, {"var": "tokens"},
                                 {"i32": FOUR_B.vocab // 4}]
    assert gather["args"] == [{"buf": "logits_part"}, {"buf": "logits"}, {"i64": FOUR_B.vocab // 4}]
    assert m["buffers"]["logits_part"]["shape"] == [1, FOUR_B.vocab // 4]
    assert m["buffers"]["logits"]["shape"] == [1, FOUR_B.vocab]
    launch = m["ops"]["allgather_bf16"]["impl"]["launches"][0]
    assert launch["entry"] == "extern:nccl_allgather_bf16" and launch["args"][-1] == {"rank": "tp"}


def _pick(v: Any, full: int, rank: int) -> tuple[int, int]:
    if v is None:
        return 0, full
    if isinstance(v, dict):
        assert v["group"] == "tp" and len(v["ranges"]) > rank
        return v["ranges"][rank][0], v["ranges"][rank][1]
    return v[0], v[1]


def _windows(spec: Mapping[str, Any], rank: int, shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, int, int, int, int]]:
    """(tensor, row0, row1, col0, col1) of each bind segment at `rank` (tensors viewed [dim0, rest])."""
    out = []
    for seg in spec["bind"]:
        t = seg["tensor"]
        shape = shapes[t]
        rest = int(np.prod(shape[1:])) if len(shape) > 1 else 1

        r0, r1 = _pick(seg.get("rows"), shape[0], rank)
        c0, c1 = _pick(seg.get("cols"), rest, rank)
        out.append((t, r0, r1, c0, c1))
    return out


@pytest.mark.parametrize(("config", "n"), [(QWEN3_TINY_CONFIG, 2), (QWEN3_4B_CONFIG, 4),
                                            ({**QWEN3_TINY_CONFIG, "tie_word_embeddings": False}, 2)],
                         ids=["tiny-tp2", "4b-tp4", "untied-tp2"])
def test_weight_plan_covers_every_tensor_once_per_group(config: Mapping[str, Any], n: int) -> None:
    shape = gen.shape_from_config(config)
    shapes = qwen3_tensor_shapes(config)
    m = _tp(shape, n)
    cover = {t: np.zeros((s[0], int(np.prod(s[1:])) if len(s) > 1 else 1), dtype=np.int32) for t, s in shapes.items()}
    for name, spec in m["buffers"].items():
        if spec["kind"] != "weight":
            continue
        per_rank = [_windows(spec, r, shapes) for r in range(n)]
        replicated = all(w == per_rank[0] for w in per_rank)
        for r, windows in enumerate(per_rank):
            rows = 0
            for t, r0, r1, c0, c1 in windows:
                if not replicated or r == 0:
                    cover[t][r0:r1, c0:c1] += 1
                rows += (r1 - r0) * (c1 - c0) // (spec["shape"][1] if len(spec["shape"]) > 1 else 1)
            assert rows == spec["shape"][0], (name, r)
    tied = shape.tied
    for t, c in cover.items():
        want = 2 if tied and t == "model.embed_tokens.weight" else 1
        assert (c == want).all(), (t, np.unique(c))


def test_rank_shape_divides_heads_mlp_and_keeps_vocab() -> None:
    r = gen.rank_shape(FOUR_B, 4)
    assert (r.heads, r.kv_heads, r.inter, r.vocab, r.hidden) == (8, 2, 2432, FOUR_B.vocab, FOUR_B.hidden)
    with pytest.raises(gen.GenError, match="tp 16 must divide the kv heads 8"):
        gen.rank_shape(FOUR_B, 16)
    with pytest.raises(gen.GenError, match="positive integer"):
        gen.rank_shape(FOUR_B, 0)


def test_tp_refuses_f32_and_an_lm_head_gemv() -> None:
    with pytest.raises(gen.GenError, match="drop --precision f32"):
        _tp(TINY, 2, precision="f32")
    with pytest.raises(gen.GenError, match="leave lm_head out of --gemv"):
        _tp(TINY, 2, gemv=("lm_head",))


def test_tp1_is_the_plain_manifest_plus_its_collectives() -> None:
    plain = gen.generate(TINY, FAKE_HASHES, FAKE_ENTRIES, model="t", plan=plan_of())
    tp1 = _tp(TINY, 1)
    drop = {"allreduce_bf16", "allgather_bf16"}
    decode = [c for c in _calls(tp1, "decode") if c["op"] not in drop]
    plain_decode = _calls(plain, "decode")
    assert [c["label"] for c in decode] == [c["label"] for c in plain_decode]
    assert [c for c in _calls(tp1, "prefill") if c["op"] not in drop] == _calls(plain, "prefill")
    assert tp1["states"] == plain["states"] and tp1["modules"] == plain["modules"]
