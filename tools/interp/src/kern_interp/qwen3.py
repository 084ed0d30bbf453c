"""A float32 numpy interpreter of Qwen3 manifests (kernels by their documented semantics, extern GEMMs,
buffers, the paged KV state) and an independent numpy Qwen3 forward, for host-side checks of the
generator's wiring: argument order, offsets, the KV layout, chunked prefill and step feeding.

Numerics are float32 throughout (no bf16 rounding of activations): the point is the wiring, the
bf16 mirroring of transformers is checked on the GPU. Checkpoints may hold BF16, F8_E4M3 and F32
tensors, each widened to float32 exactly; an fp8e4m3 buffer holds its decoded e4m3 values.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kern_manifest import KernelLaunch, Manifest, manifest_to_json, parse_manifest
from kern_qwen3 import (
    FP8_BLOCK,
    QWEN3_TINY_CONFIG,
    from_e4m3_bits,
    quantize_blocks,
    random_checkpoint,
    spread_blocks,
)
from kern_runtime import domains as kr_domains
from kern_runtime import errors as kr_errors

F32 = np.float32
_NP = {"bf16": F32, "f32": F32, "fp8e4m3": F32, "i64": np.int64, "i32": np.int32}
_SIZE = {"bf16": 2, "f32": 4, "fp8e4m3": 1, "i64": 8, "i32": 4}

Ptr = tuple[np.ndarray, int]  # flat array, element offset


E4M3_VALUES = from_e4m3_bits(np.arange(256, dtype=np.uint8))
"""float8_e4m3fn byte -> its float32 value (exact), 256 entries: kern_qwen3's table."""

_DTYPE_BYTES = {"BF16": 2, "F8_E4M3": 1, "F32": 4}
"""The safetensors dtypes the CPU backend reads, by bytes per element."""


def read_checkpoint(directory: Path) -> dict[str, np.ndarray]:
    """safetensors (BF16, F8_E4M3 and F32 tensors) -> float32 arrays (exact widening)."""
    return read_files(sorted(directory.glob("*.safetensors")))


@dataclass(frozen=True, slots=True)
class TensorHead:
    """One tensor of a checkpoint file: its shape, the file's byte range of its data and its
    safetensors dtype (BF16, F8_E4M3 or F32)."""

    shape: tuple[int, ...]
    start: int
    stop: int
    dtype: str = "BF16"

    @property
    def size(self) -> int:
        """Elements."""
        return math.prod(self.shape)


def _where(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 60 else "..." + text[-57:]


def read_header(path: Path) -> dict[str, TensorHead]:
    """The tensors of one .safetensors file of BF16, F8_E4M3 and F32 tensors, from its header alone
    (checked against the file's size before anything past the header is read).

    Raises:
        kern_runtime.WeightArtifactError: not a safetensors file, or a tensor of another dtype or
            whose bytes do not fit its shape (at its dtype's element size) or the file.
    """
    where = f"weights {_where(path)}"
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= size - 8:
                raise kr_errors.WeightArtifactError(f"{where}: not a safetensors file ({size} bytes, no header)")
            raw = f.read(n)
    except OSError as exc:
        raise kr_errors.InputFileError(f"{where}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise kr_errors.WeightArtifactError(f"{where}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise kr_errors.WeightArtifactError(f"{where}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return {str(name): _tensor_head(where, str(name), meta, 8 + n, size)
            for name, meta in header.items()}  # pyright: ignore[reportUnknownVariableType]


def _tensor_head(where: str, name: str, meta: Any, base: int, size: int) -> TensorHead:
    try:
        dtype, shape, (a, b) = meta["dtype"], tuple(int(d) for d in meta["shape"]), meta["data_offsets"]
        a, b = int(a), int(b)
    except (KeyError, TypeError, ValueError):
        raise kr_errors.WeightArtifactError(f"{where}: tensor {name[:48]!r} has a bad header entry") from None
    elem = _DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
    if elem is None:
        raise kr_errors.WeightArtifactError(f"{where}: tensor {name[:48]!r} is {str(dtype)[:16]}; the CPU backend "
                                            "reads BF16, F8_E4M3 and F32 tensors")
    if min(shape, default=0) < 0 or not 0 <= a <= b or b - a != elem * math.prod(shape) or base + b > size:
        raise kr_errors.WeightArtifactError(f"{where}: tensor {name[:48]!r} bytes [{a}, {b}) do not fit its shape "
                                            "or the file")
    return TensorHead(shape, base + a, base + b, dtype)


def _decode(data: bytes, dtype: str) -> np.ndarray:
    """One tensor's bytes (BF16, F8_E4M3 or F32, little-endian) as a flat float32 array (exact)."""
    if dtype == "F8_E4M3":
        return E4M3_VALUES[np.frombuffer(data, dtype=np.uint8)]
    if dtype == "F32":
        return np.frombuffer(data, dtype="<f4").astype(F32)
    return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(F32)


def read_files(paths: Sequence[Path]) -> dict[str, np.ndarray]:
    """The tensors of .safetensors files (BF16, F8_E4M3 and F32) as float32 arrays (exact widening).

    Raises:
        as `read_header`.
    """
    out: dict[str, np.ndarray] = {}
    for path in paths:
        heads = read_header(path)
        raw = path.read_bytes()
        for name, t in heads.items():
            out[name] = _decode(raw[t.start : t.stop], t.dtype).reshape(t.shape)
    return out


# --------------------------------------------------------------------------------------------
# Kernels, by the semantics documented in tools/kernels-src.


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps)) * w


def _view(p: Ptr, n: int) -> np.ndarray:
    arr, off = p
    return arr[off : off + n]


def k_embed(t: int, ids: Ptr, table: Ptr, out: Ptr, hidden: int) -> None:
    idx = _view(ids, t)
    tab = table[0][table[1] :].reshape(-1, hidden)
    _view(out, t * hidden)[:] = tab[idx].reshape(-1)


def k_rmsnorm(t: int, x: Ptr, w: Ptr, out: Ptr, hidden: int, eps: float) -> None:
    _view(out, t * hidden)[:] = _rms(_view(x, t * hidden).reshape(t, hidden), _view(w, hidden), eps).reshape(-1)


def k_add_rmsnorm(t: int, res: Ptr, y: Ptr, w: Ptr, out: Ptr, hidden: int, eps: float) -> None:
    r = _view(res, t * hidden)
    r += _view(y, t * hidden)
    _view(out, t * hidden)[:] = _rms(r.reshape(t, hidden), _view(w, hidden), eps).reshape(-1)


def k_qk_norm_rope(t: int, qkv: Ptr, wq: Ptr, wk: Ptr, pos: Ptr, cos: Ptr, sin: Ptr, nq: int, nkv: int,
                   d: int, eps: float) -> None:
    half = d // 2
    rows = _view(qkv, t * (nq + 2 * nkv) * d).reshape(t, nq + 2 * nkv, d)
    positions = _view(pos, t)
    c = cos[0][cos[1] :].reshape(-1, half)[positions][:, None, :]
    s = sin[0][sin[1] :].reshape(-1, half)[positions][:, None, :]
    for lo, hi, w in ((0, nq, _view(wq, d)), (nq, nq + nkv, _view(wk, d))):
        x = _rms(rows[:, lo:hi], w, eps)
        x1, x2 = x[..., :half].copy(), x[..., half:].copy()
        rows[:, lo:hi, :half] = x1 * c - x2 * s
        rows[:, lo:hi, half:] = x2 * c + x1 * s


def k_kv_write(t: int, qkv: Ptr, kv: Ptr, slots: Ptr, nq: int, nkv: int, d: int, p: int, page_stride: int) -> None:
    rows = _view(qkv, t * (nq + 2 * nkv) * d).reshape(t, nq + 2 * nkv, d)
    arr, base = kv
    for r, slot in enumerate(_view(slots, t)):
        for h in range(nkv):
            k_at = base + (slot // p) * page_stride + ((slot % p) * nkv + h) * d
            v_at = k_at + p * nkv * d
            arr[k_at : k_at + d] = rows[r, nq + h]
            arr[v_at : v_at + d] = rows[r, nq + nkv + h]


def k_qk_norm_rope_kv(t: int, qkv: Ptr, wq: Ptr, wk: Ptr, pos: Ptr, cos: Ptr, sin: Ptr, kv: Ptr, slots: Ptr,
                      nq: int, nkv: int, d: int, eps: float, p: int, page_stride: int) -> None:
    k_qk_norm_rope(t, qkv, wq, wk, pos, cos, sin, nq, nkv, d, eps)
    k_kv_write(t, qkv, kv, slots, nq, nkv, d, p, page_stride)


def _gather_kv(kv: Ptr, bt: Ptr, n: int, nkv: int, d: int, p: int, page_stride: int) -> tuple[np.ndarray, np.ndarray]:
    arr, base = kv
    table = bt[0][bt[1] :]
    ks = np.empty((n, nkv, d), F32)
    vs = np.empty((n, nkv, d), F32)
    for tok in range(n):
        at = base + int(table[tok // p]) * page_stride + (tok % p) * nkv * d
        ks[tok] = arr[at : at + nkv * d].reshape(nkv, d)
        vs[tok] = arr[at + p * nkv * d : at + p * nkv * d + nkv * d].reshape(nkv, d)
    return ks, vs


def _attend(q: np.ndarray, ks: np.ndarray, vs: np.ndarray, limit: np.ndarray, scale: float) -> np.ndarray:
    """q [rows, nq, d]; keys < limit[row] are visible."""
    nq, nkv = q.shape[1], ks.shape[1]
    group = nq // nkv
    kh = np.repeat(ks, group, axis=1)  # [n, nq, d]
    vh = np.repeat(vs, group, axis=1)
    scores = np.einsum("rhd,nhd->rhn", q, kh) * F32(scale)
    mask = np.arange(ks.shape[0])[None, None, :] >= limit[:, None, None]
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("rhn,nhd->rhd", w, vh).astype(F32)


def k_attn_prefill(t: int, qkv: Ptr, kv: Ptr, bt: Ptr, seq_len: Ptr, out: Ptr, rows: int, nq: int, nkv: int,
                   d: int, p: int, page_stride: int, scale: float) -> None:
    n = int(_view(seq_len, 1)[0])
    q = _view(qkv, rows * (nq + 2 * nkv) * d).reshape(rows, nq + 2 * nkv, d)[:, :nq]
    ks, vs = _gather_kv(kv, bt, n, nkv, d, p, page_stride)
    limit = n - rows + np.arange(rows) + 1
    _view(out, rows * nq * d)[:] = _attend(q, ks, vs, limit, scale).reshape(-1)


PREFILL_BM, PREFILL_BN, PREFILL_TARGET, PREFILL_MIN_TILES = 128, 64, 132, 4
"""prefill.cuh's PF_BM, PF_BN, PF_TARGET, PF_MIN_TILES (PF_MAX_SPLITS, PF_SPLIT_ROWS: kern_qwen3.entries)."""


def prefill_zcap(rows: int) -> int:
    """kern_prefill_attn's grid z for a chunk of `rows` rows (prefill.cuh's prefill_zcap)."""
    from kern_qwen3.entries import PREFILL_SPLIT_ROWS, PREFILL_SPLITS

    return min(PREFILL_SPLITS, -(-PREFILL_SPLIT_ROWS // rows))


def prefill_splits(n: int, rows: int, nq: int, nkv: int) -> int:
    """The key splits kern_prefill_attn chooses for `rows` rows ending at seq_len `n`."""
    work = -(-rows * (nq // nkv) // PREFILL_BM) * nkv
    tiles = -(-n // PREFILL_BN)
    return min(prefill_zcap(rows), max(1, PREFILL_TARGET // work), max(1, tiles // PREFILL_MIN_TILES))


def _prefill_block_keys(mt: int, rows: int, group: int, base: int, splits: int, z: int) -> tuple[int, int]:
    """Keys [lo, hi) that split z of the block of packed rows [64 mt, 64 mt + 64) reads."""
    kv_end = base + min(mt * PREFILL_BM + PREFILL_BM - 1, rows * group - 1) // group + 1
    tiles = -(-kv_end // PREFILL_BN)
    per = -(-tiles // splits)
    t0 = min(z * per, tiles)
    return t0 * PREFILL_BN, min(min(t0 + per, tiles) * PREFILL_BN, kv_end)


def k_prefill_attn(t: int, qkv: Ptr, kv: Ptr, bt: Ptr, seq_len: Ptr, out: Ptr, part_o: Ptr, part_lse: Ptr,
                   rows: int, nq: int, nkv: int, d: int, p: int, page_stride: int, scale: float) -> None:
    """One split: the chunk's attention rows into `out`; more: each split's normalized rows and
    log2-sum-exps (-inf where a row sees no key of the split) into the partials."""
    n = int(_view(seq_len, 1)[0])
    splits = prefill_splits(n, rows, nq, nkv)
    q = _view(qkv, rows * (nq + 2 * nkv) * d).reshape(rows, nq + 2 * nkv, d)[:, :nq]
    ks, vs = _gather_kv(kv, bt, n, nkv, d, p, page_stride)
    base = n - rows
    if splits == 1:
        _view(out, rows * nq * d)[:] = _attend(q, ks, vs, base + np.arange(rows) + 1, scale).reshape(-1)
        return
    group = nq // nkv
    po = _view(part_o, splits * rows * nq * d).reshape(splits, rows, nq, d)
    pl = _view(part_lse, splits * rows * nq).reshape(splits, rows, nq)
    for packed in range(rows * group):
        tok, g = divmod(packed, group)
        for kvh in range(nkv):
            h = kvh * group + g
            for z in range(splits):
                lo, hi = _prefill_block_keys(packed // PREFILL_BM, rows, group, base, splits, z)
                hi = min(hi, base + tok + 1)
                if lo >= hi:
                    po[z, tok, h], pl[z, tok, h] = 0, -np.inf
                    continue
                sc = ks[lo:hi, kvh] @ q[tok, h] * F32(scale) * F32(np.log2(np.e))
                m = sc.max()
                w = np.exp2(sc - m)
                po[z, tok, h] = w @ vs[lo:hi, kvh] / w.sum()
                pl[z, tok, h] = m + np.log2(w.sum())


def k_prefill_combine(t: int, part_o: Ptr, part_lse: Ptr, seq_len: Ptr, out: Ptr, rows: int, nq: int, nkv: int,
                      d: int) -> None:
    n = int(_view(seq_len, 1)[0])
    splits = prefill_splits(n, rows, nq, nkv)
    if splits == 1:
        return
    po = _view(part_o, splits * rows * nq * d).reshape(splits, rows, nq, d)
    pl = _view(part_lse, splits * rows * nq).reshape(splits, rows, nq)
    w = np.exp2(pl - pl.max(axis=0, keepdims=True))
    _view(out, rows * nq * d)[:] = (np.einsum("srh,srhd->rhd", w, po) / w.sum(axis=0)[..., None]).reshape(-1)


def k_attn_decode_partial(t: int, qkv: Ptr, kv: Ptr, bt: Ptr, seq_len: Ptr, part_o: Ptr, part_lse: Ptr, nq: int,
                          nkv: int, d: int, p: int, page_stride: int, splits: int, scale: float) -> None:
    n = int(_view(seq_len, 1)[0])
    q = _view(qkv, (nq + 2 * nkv) * d).reshape(nq + 2 * nkv, d)[:nq]
    ks, vs = _gather_kv(kv, bt, n, nkv, d, p, page_stride)
    pages = -(-n // p)
    pps = -(-pages // splits)
    po = _view(part_o, splits * nq * d).reshape(splits, nq, d)
    pl = _view(part_lse, splits * nq).reshape(splits, nq)
    group = nq // nkv
    for s in range(splits):
        lo, hi = s * pps * p, min((s + 1) * pps * p, n)
        if lo >= hi:
            pl[s] = -np.inf
            po[s] = 0
            continue
        kh = np.repeat(ks[lo:hi], group, axis=1)
        vh = np.repeat(vs[lo:hi], group, axis=1)
        sc = np.einsum("hd,nhd->hn", q, kh) * F32(scale) * F32(np.log2(np.e))
        m = sc.max(axis=-1, keepdims=True)
        w = np.exp2(sc - m)
        po[s] = np.einsum("hn,nhd->hd", w / w.sum(axis=-1, keepdims=True), vh)
        pl[s] = (m[:, 0] + np.log2(w.sum(axis=-1))).astype(F32)


def k_attn_decode_reduce(t: int, part_o: Ptr, part_lse: Ptr, out: Ptr, nq: int, d: int, splits: int) -> None:
    po = _view(part_o, splits * nq * d).reshape(splits, nq, d)
    pl = _view(part_lse, splits * nq).reshape(splits, nq)
    w = np.exp2(pl - pl.max(axis=0, keepdims=True))
    _view(out, nq * d)[:] = (np.einsum("sh,shd->hd", w, po) / w.sum(axis=0)[:, None]).reshape(-1)


def k_attn_decode(t: int, qkv: Ptr, kv: Ptr, bt: Ptr, seq_len: Ptr, part_o: Ptr, part_lse: Ptr, counters: Ptr,
                  out: Ptr, nq: int, nkv: int, d: int, p: int, page_stride: int, splits: int, scale: float) -> None:
    """Partials of the splits that hold tokens, reduced over those splits; the counters must be
    zero before (the load program zeroes them) and are zero after."""
    count = _view(counters, nkv)
    assert not count.any(), "kern_attn_decode's counters are not zero: the load program must zero them"
    k_attn_decode_partial(t, qkv, kv, bt, seq_len, part_o, part_lse, nq, nkv, d, p, page_stride, splits, scale)
    pages = -(-int(_view(seq_len, 1)[0]) // p)
    pps = -(-pages // splits)
    used = -(-pages // pps)
    k_attn_decode_reduce(t, part_o, part_lse, out, nq, d, used)


def k_attn_decode_rows(t: int, qkv: Ptr, kv: Ptr, bt: Ptr, seq_lens: Ptr, part_o: Ptr, part_lse: Ptr, counters: Ptr,
                       out: Ptr, nq: int, nkv: int, d: int, p: int, page_stride: int, table_stride: int,
                       max_splits: int, scale: float) -> None:
    """kern_attn_decode_rows and kern_attn_decode_one (the one-row step's; the same arguments): `t`
    rows (the program's rows: `tokens` for the one-row step, `rows` for the batched step), each
    over its own seq_lens[r] tokens through its block-table row (block_table + r * table_stride):
    attention as kern_attn_decode_partial + _reduce give it (how the kernel splits a row is its own
    business); a row of 0 tokens gets zeros. The counters ([rows, nkv]) must be zero before (the load
    program zeroes them) and are zero after."""
    assert not _view(counters, t * nkv).any(), "kern_attn_decode_rows' counters are not zero: the load program must zero them"
    width = (nq + 2 * nkv) * d
    o = _view(out, t * nq * d).reshape(t, nq * d)
    for r in range(t):
        n = int(_view(seq_lens, t)[r])
        if n == 0:
            o[r] = 0
            continue
        q = _view((qkv[0], qkv[1] + r * width), width).reshape(nq + 2 * nkv, d)[None, :nq]
        ks, vs = _gather_kv(kv, (bt[0], bt[1] + r * table_stride), n, nkv, d, p, page_stride)
        o[r] = _attend(q, ks, vs, np.array([n]), scale).reshape(-1)


def k_attn_decode_qkn(t: int, qkv: Ptr, wq: Ptr, wk: Ptr, pos: Ptr, cos: Ptr, sin: Ptr, kv: Ptr, slots: Ptr,
                      bt: Ptr, seq_len: Ptr, part_o: Ptr, part_lse: Ptr, counters: Ptr, out: Ptr, nq: int, nkv: int,
                      d: int, p: int, page_stride: int, splits: int, scale: float, eps: float) -> None:
    """kern_qk_norm_rope_kv then kern_attn_decode, leaving qkv as the GEMV wrote it (the kernel norms
    and rotates its copies of q and k)."""
    raw = _view(qkv, t * (nq + 2 * nkv) * d).copy()
    k_qk_norm_rope_kv(t, qkv, wq, wk, pos, cos, sin, kv, slots, nq, nkv, d, eps, p, page_stride)
    k_attn_decode(t, qkv, kv, bt, seq_len, part_o, part_lse, counters, out, nq, nkv, d, p, page_stride, splits, scale)
    _view(qkv, raw.size)[:] = raw


_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox4x32(c: Sequence[np.ndarray], key: tuple[int, int]) -> list[np.ndarray]:
    """Philox4x32-10 over arrays of counters (four uint32 words each) and one 64-bit key (two words),
    as sampling.cu computes it."""
    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(w, dtype=np.uint64) for w in c)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(10):
        p0, p1 = np.uint64(_PHILOX_M[0]) * c0, np.uint64(_PHILOX_M[1]) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + np.uint64(_PHILOX_W[0])) & mask, (k1 + np.uint64(_PHILOX_W[1])) & mask
    return [w.astype(np.uint32) for w in (c0, c1, c2, c3)]


def gumbel(seed: int, pos: int, n: int) -> np.ndarray:
    """g_i = -log(-log(u_i)) (f32) for i < n: kern_sample_rows' draw keyed by (seed, position)."""
    groups = np.arange(-(-n // 4), dtype=np.uint64)
    s, q = seed & 0xFFFFFFFFFFFFFFFF, pos & 0xFFFFFFFFFFFFFFFF
    words = philox4x32((groups, np.full_like(groups, q & 0xFFFFFFFF), np.full_like(groups, q >> 32),
                        np.zeros_like(groups)), (s & 0xFFFFFFFF, s >> 32))
    w = np.stack(words, axis=1).reshape(-1)[:n]
    u = ((w >> np.uint32(8)).astype(F32) + F32(0.5)) * F32(1.0 / 16777216.0)
    return (-np.log(-np.log(u))).astype(F32)


def float_keys(z: np.ndarray) -> np.ndarray:
    """sampling.cu's float_key: f32 values as order-preserving uint32."""
    u = np.asarray(z, dtype=F32).view(np.uint32)
    return np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000)).astype(np.uint32)


def _largest_key(keys: np.ndarray, weight: np.ndarray, target: float) -> int:
    """The largest key K with sum(weight[keys >= K]) >= target (ties of K included)."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    per = np.zeros(uniq.size, dtype=np.float64)
    np.add.at(per, inverse, weight.astype(np.float64))
    cum = np.cumsum(per[::-1])
    return int(uniq[::-1][int(np.argmax(cum >= target))])


def sample_mask(x: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The tokens kern_sample_rows may draw for one row of logits x (temperature > 0): key(z) >= the
    k-th largest key, then >= the largest key whose kept mass reaches top_p of the kept mass."""
    z = (x.astype(F32) * (F32(1.0) / F32(temperature))).astype(F32)
    keys = float_keys(z)
    thr = 0
    if 0 < top_k < x.size:
        thr = _largest_key(keys, np.ones(x.size), top_k)
    if top_p < 1.0:
        kept = keys >= thr
        e = np.where(kept, np.exp((z - z.max()).astype(F32)), F32(0)).astype(F32)
        thr = max(thr, _largest_key(keys, e, float(F32(top_p) * F32(e.sum(dtype=np.float64)))))
    return keys >= thr


def sample_token(x: np.ndarray, params: Sequence[float], seed: int, pos: int) -> int:
    """kern_sample_rows' token for one row of logits x (f32) and its (temperature, top_p, top_k, _)."""
    temperature, top_p, top_k = float(params[0]), float(params[1]), int(params[2])
    if not temperature > 0:
        return int(np.argmax(x))
    z = (x.astype(F32) * (F32(1.0) / F32(temperature))).astype(F32)
    score = ((z - z.max()).astype(F32) + gumbel(seed, pos, x.size)).astype(F32)
    score = np.where(sample_mask(x, temperature, top_k, top_p), score, -np.inf)
    return int(np.argmax(score))


def k_sample_rows(t: int, logits: Ptr, params: Ptr, seeds: Ptr, positions: Ptr, tokens: Ptr, lp: Ptr, top: Ptr,
                  n: int, top_n: int) -> None:
    """Per row r < t: tokens[r] = sample_token(...); with logprobs >= 0 the chosen token's
    log-softmax of x in lp[r, 0], with N > 0 the N largest in lp[r, 1:1 + N] / top[r, :N]."""
    xs = _view(logits, t * n).reshape(t, n)
    prm = _view(params, t * 4).reshape(t, 4)
    out_lp = _view(lp, t * (1 + top_n)).reshape(t, 1 + top_n)
    out_top = _view(top, t * top_n).reshape(t, top_n)
    for r in range(t):
        x = xs[r].astype(F32)
        tok = sample_token(x, prm[r], int(_view(seeds, t)[r]), int(_view(positions, t)[r]))
        _view(tokens, t)[r] = tok
        m = x.max()
        lse = F32(m + np.log(np.exp(x - m).sum(dtype=np.float64)))
        want = int(prm[r, 3])
        if want >= 0:
            out_lp[r, 0] = x[tok] - lse
        order = np.lexsort((np.arange(n), -x))[: max(0, min(want, top_n))]
        out_lp[r, 1 : 1 + order.size] = x[order] - lse
        out_top[r, : order.size] = order


def k_rows_advance(t: int, nxt: Ptr, ids: Ptr, pos: Ptr, slots: Ptr, lens: Ptr, bt: Ptr, stride: int, p: int,
                   rows: int) -> None:
    for r in range(rows):
        q = int(_view(pos, rows)[r]) + 1
        _view(ids, rows)[r] = _view(nxt, rows)[r]
        _view(pos, rows)[r] = q
        _view(slots, rows)[r] = int(bt[0][bt[1] + r * stride + q // p]) * p + q % p
        _view(lens, rows)[r] += 1


def k_rows_seed(t: int, ids_in: Ptr, pos_in: Ptr, slots_in: Ptr, lens_in: Ptr, valid: Ptr, ids: Ptr, pos: Ptr,
                slots: Ptr, lens: Ptr, rows: int) -> None:
    keep = _view(valid, rows) != 0
    for src, dst in ((ids_in, ids), (pos_in, pos), (slots_in, slots), (lens_in, lens)):
        _view(dst, rows)[keep] = _view(src, rows)[keep]


def k_zero_i32(t: int, dst: Ptr, n: int) -> None:
    _view(dst, n)[:] = 0


def k_silu_mul(t: int, gu: Ptr, out: Ptr, inter: int) -> None:
    x = _view(gu, t * 2 * inter).reshape(t, 2 * inter)
    g, u = x[:, :inter], x[:, inter:]
    _view(out, t * inter)[:] = (g / (1 + np.exp(-g)) * u).reshape(-1)


def k_argmax_partial(t: int, logits: Ptr, pval: Ptr, pidx: Ptr, n: int) -> None:
    x = _view(logits, n)
    i = int(np.argmax(x))  # NOTE: numpy's argmax takes the first (lowest) index of a tie
    _view(pval, 1)[0] = x[i]
    _view(pidx, 1)[0] = i


def k_argmax_final(t: int, pval: Ptr, pidx: Ptr, nxt: Ptr, parts: int) -> None:
    _view(nxt, 1)[0] = _view(pidx, 1)[0]


def k_decode_advance(t: int, nxt: Ptr, ids: Ptr, pos: Ptr, slots: Ptr, seq_len: Ptr, bt: Ptr, p: int) -> None:
    q = int(_view(pos, 1)[0]) + 1
    _view(ids, 1)[0] = _view(nxt, 1)[0]
    _view(pos, 1)[0] = q
    _view(slots, 1)[0] = int(bt[0][bt[1] + q // p]) * p + q % p
    _view(seq_len, 1)[0] += 1


def k_copy(t: int, src: Ptr, dst: Ptr, n: int) -> None:
    _view(dst, n)[:] = _view(src, n)


def k_gemv(t: int, x: Ptr, w: Ptr, y: Ptr, rows: int, n: int, k: int, y_stride: int) -> None:
    xs = _view(x, rows * k).reshape(rows, k)
    ws = _view(w, n * k).reshape(n, k)
    out = _view(y, rows * y_stride).reshape(rows, y_stride)
    out[:, :n] = xs @ ws.T


def k_gemv_silu(t: int, x: Ptr, w: Ptr, y: Ptr, rows: int, n: int, k: int, y_stride: int) -> None:
    """W is [2n, k] (gate rows, then up rows); y[:, :n] = silu(x W_gate^T) * (x W_up^T)."""
    xs = _view(x, rows * k).reshape(rows, k)
    ws = _view(w, 2 * n * k).reshape(2 * n, k)
    g, u = xs @ ws[:n].T, xs @ ws[n:].T
    _view(y, rows * y_stride).reshape(rows, y_stride)[:, :n] = g / (1 + np.exp(-g)) * u


def _fold(t: int, res_in: Ptr, y_add: Ptr, w_norm: Ptr, res_out: Ptr, rows: int, k: int, eps: float) -> Ptr:
    """kern_add_rmsnorm into res_out (res_in left as it is); returns the normed x (a fresh array)."""
    h = _view(res_in, rows * k) + _view(y_add, rows * k)
    _view(res_out, rows * k)[:] = h
    return (_rms(h.reshape(rows, k), _view(w_norm, k), eps).reshape(-1).astype(F32), 0)


def k_gemv_norm(t: int, res_in: Ptr, y_add: Ptr, w_norm: Ptr, res_out: Ptr, w: Ptr, y: Ptr, rows: int, n: int,
                k: int, y_stride: int, eps: float) -> None:
    """kern_add_rmsnorm (into res_out) then the GEMV of its output (gemv_norm.cu)."""
    k_gemv(t, _fold(t, res_in, y_add, w_norm, res_out, rows, k, eps), w, y, rows, n, k, y_stride)


def k_gemv_silu_norm(t: int, res_in: Ptr, y_add: Ptr, w_norm: Ptr, res_out: Ptr, w: Ptr, y: Ptr, rows: int,
                     n: int, k: int, y_stride: int, eps: float) -> None:
    """kern_add_rmsnorm (into res_out) then the gate/up GEMV with SiLU-and-mul (gemv_norm.cu)."""
    k_gemv_silu(t, _fold(t, res_in, y_add, w_norm, res_out, rows, k, eps), w, y, rows, n, k, y_stride)


def k_gemv_tail(t: int, x: Ptr, w: Ptr, y: Ptr, rows: int, n: int, k: int, y_stride: int, res_in: Ptr, w_norm: Ptr,
                res_out: Ptr, x_out: Ptr, counter: Ptr, eps: float) -> None:
    """The GEMV of x, then kern_add_rmsnorm(res_in + y -> res_out, w_norm -> x_out) in its last block
    (gemv_tail.cu); the block counter ends at zero."""
    k_gemv(t, x, w, y, rows, n, k, y_stride)
    _view(x_out, rows * n)[:] = _view(_fold(t, res_in, y, w_norm, res_out, rows, n, eps), rows * n)
    _view(counter, 1)[:] = 0


def _e4m3_weight(w: Ptr, s: Ptr, n: int, k: int) -> np.ndarray:
    """The [n, k] weight W[c, j] * s[c // 128, j // 128] of e4m3 values `w` and float32 block scales
    `s` [ceil(n / 128), ceil(k / 128)] (the last block row and column trimmed where partial)."""
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    scales = spread_blocks(_view(s, nb * kb).reshape(nb, kb), n, k)
    return (_view(w, n * k).reshape(n, k) * scales).astype(F32)


def k_gemv_e4m3_b128(t: int, x: Ptr, w: Ptr, s: Ptr, y: Ptr, rows: int, n: int, k: int, y_stride: int) -> None:
    """kern_gemv_e4m3_b128 (fp8.cu): x [rows, k] (row stride k), w [n, k] e4m3, s [ceil(n / 128),
    ceil(k / 128)] float32 block scales; y[r, c] = sum over 128-wide k blocks b of s[c // 128, b] *
    sum_{j in b} x[r, j] w[c, j] for c < n (y's row stride y_stride, its columns >= n untouched).
    Computed as x (w * s)^T in float32 (the kernel's bf16 rounding of y is not modelled)."""
    xs = _view(x, rows * k).reshape(rows, k)
    _view(y, rows * y_stride).reshape(rows, y_stride)[:, :n] = xs @ _e4m3_weight(w, s, n, k).T


def k_dequant_e4m3_b128(t: int, w: Ptr, s: Ptr, out: Ptr, n: int, k: int) -> None:
    """kern_dequant_e4m3_b128 (fp8.cu): out[c, j] = w[c, j] * s[c // 128, j // 128] for the [n, k]
    e4m3 weight and its float32 block scales. `out` is bf16 on the GPU, which rounds each value to
    bf16; the interpreter keeps the float32 product, as it keeps float32 everywhere."""
    _view(out, n * k)[:] = _e4m3_weight(w, s, n, k).reshape(-1)


def _e4m3_rows(w: Ptr, s: Ptr, n: int, k: int) -> np.ndarray:
    """The [n, k] weight W[c, j] * s[c] of e4m3 values `w` and one float32 scale per output row `s` [n]."""
    return (_view(w, n * k).reshape(n, k) * _view(s, n)[:, None]).astype(F32)


def k_gemv_e4m3_row(t: int, x: Ptr, w: Ptr, s: Ptr, y: Ptr, rows: int, n: int, k: int, y_stride: int) -> None:
    """kern_gemv_e4m3_row (fp8.cu): kern_gemv_e4m3_b128 over one scale per output row, s [n]:
    y[r, c] = s[c] * sum_j x[r, j] w[c, j] for c < n, as x (w * s)^T in float32."""
    xs = _view(x, rows * k).reshape(rows, k)
    _view(y, rows * y_stride).reshape(rows, y_stride)[:, :n] = xs @ _e4m3_rows(w, s, n, k).T


def k_dequant_e4m3_row(t: int, w: Ptr, s: Ptr, out: Ptr, n: int, k: int) -> None:
    """kern_dequant_e4m3_row (fp8.cu): out[c, j] = w[c, j] * s[c] (float32 here, bf16 on the GPU)."""
    _view(out, n * k)[:] = _e4m3_rows(w, s, n, k).reshape(-1)


def k_quant_e4m3_b128(t: int, src: Ptr, w: Ptr, s: Ptr, n: int, k: int) -> None:
    """kern_quant_e4m3_b128 (fp8.cu): the [n, k] bf16 weight quantised as a Qwen FP8 checkpoint
    holds it (`kern_qwen3.quantize_blocks`: block amax / 448, e4m3 to nearest even); w gets the e4m3
    values (the interpreter holds e4m3 as float32), s the block scales."""
    q, scales = quantize_blocks(_view(src, n * k).reshape(n, k))
    _view(w, n * k)[:] = from_e4m3_bits(q).reshape(-1)
    _view(s, scales.size)[:] = scales.reshape(-1)


def k_rope_table(t: int, cos: Ptr, sin: Ptr, maxpos: int, half: int, theta: float) -> None:
    inv = (1.0 / np.power(np.float64(theta), np.arange(half) * 2 / (2 * half))).astype(F32)
    ang = np.arange(maxpos, dtype=F32)[:, None] * inv[None, :]
    _view(cos, maxpos * half)[:] = np.cos(ang).reshape(-1)
    _view(sin, maxpos * half)[:] = np.sin(ang).reshape(-1)


def k_linear(t: int, a: Ptr, w: Ptr, c: Ptr, m: int, n: int, k: int) -> None:
    """c[m, n] = a[m, k] . w[n, k]^T (cublasLt's bf16 GEMM, kern_f32_gemm, kern_f32_gemv)."""
    _view(c, m * n)[:] = (_view(a, m * k).reshape(m, k) @ _view(w, n * k).reshape(n, k).T).reshape(-1)


# NOTE: the interpreter computes in float32 throughout, so qwen3_f32.cu's entries (f32 activations
# and KV) share the bf16 entries' models where their parameters are the same.
F32_KERNELS: dict[str, Callable[..., None]] = {
    "kern_f32_embed": k_embed, "kern_f32_rmsnorm": k_rmsnorm, "kern_f32_add_rmsnorm": k_add_rmsnorm,
    "kern_f32_qk_norm_rope_kv": k_qk_norm_rope_kv, "kern_f32_attn": k_attn_prefill, "kern_f32_gemm": k_linear,
    "kern_f32_gemv": k_linear, "kern_f32_silu_mul": k_silu_mul, "kern_f32_argmax_partial": k_argmax_partial,
    "kern_f32_rope_table": k_rope_table,
}  # fmt: skip
F32_STATE_ENTRIES = frozenset({"kern_f32_qk_norm_rope_kv", "kern_f32_attn"})
"""Entries that address the `kv` state in 4-byte elements; every other state entry in bf16's 2."""

KERNELS: dict[str, Callable[..., None]] = {
    "kern_embed": k_embed, "kern_rmsnorm": k_rmsnorm, "kern_add_rmsnorm": k_add_rmsnorm,
    "kern_qk_norm_rope": k_qk_norm_rope, "kern_kv_write": k_kv_write, "kern_attn_prefill": k_attn_prefill,
    "kern_prefill_attn": k_prefill_attn, "kern_prefill_combine": k_prefill_combine,
    "kern_attn_decode_partial": k_attn_decode_partial, "kern_attn_decode_reduce": k_attn_decode_reduce,
    "kern_silu_mul": k_silu_mul, "kern_argmax_partial": k_argmax_partial, "kern_argmax_final": k_argmax_final,
    "kern_decode_advance": k_decode_advance, "kern_copy_i64": k_copy, "kern_copy_i32": k_copy,
    "kern_rope_table": k_rope_table, "kern_gemv_bf16": k_gemv, "kern_gemv_bf16_s4": k_gemv,
    "kern_gemv_bf16_s2": k_gemv, "kern_gemv_bf16_s8": k_gemv, "kern_gemv_bf16_q4": k_gemv,
    "kern_gemv_bf16_s2q4": k_gemv, "kern_gemv_bf16_s4q4": k_gemv, "kern_gemv_bf16_b4": k_gemv,
    "kern_gemv_bf16_tma": k_gemv, "kern_gemv_bf16_b4_silu": k_gemv_silu, "kern_gemv_bf16_tma_silu": k_gemv_silu,
    "kern_gemv_bf16_c2": k_gemv, "kern_gemv_bf16_p4": k_gemv, "kern_gemv_bf16_d4": k_gemv,
    "kern_gemv_bf16_d8": k_gemv, "kern_gemv_bf16_d4_silu": k_gemv_silu,
    "kern_gemv_bf16_p4_silu": k_gemv_silu, "kern_gemv_bf16_silu": k_gemv_silu, "kern_qk_norm_rope_kv": k_qk_norm_rope_kv,
    "kern_qk_norm_rope_kv_rows": k_qk_norm_rope_kv,
    "kern_attn_decode": k_attn_decode, "kern_attn_decode_rows": k_attn_decode_rows, "kern_attn_decode_one": k_attn_decode_rows, "kern_attn_decode_wide": k_attn_decode, "kern_attn_decode_late": k_attn_decode,
    "kern_attn_decode_wide_late": k_attn_decode, "kern_attn_decode_qkn": k_attn_decode_qkn, "kern_zero_i32": k_zero_i32,
    "kern_sample_rows": k_sample_rows, "kern_rows_advance": k_rows_advance,
    "kern_rows_seed": k_rows_seed,
    "kern_gemv_bf16_b4_n": k_gemv_norm, "kern_gemv_bf16_b4_silu_n": k_gemv_silu_norm, "kern_gemv_bf16_r4": k_gemv,
    "kern_gemv_bf16_r4_silu": k_gemv_silu, "kern_gemv_bf16_r4_n": k_gemv_norm,
    "kern_gemv_bf16_r4_silu_n": k_gemv_silu_norm, "kern_gemv_bf16_s4_an": k_gemv_tail,
    "kern_gemv_bf16_p4_an": k_gemv_tail, "kern_gemv_bf16_p4_n": k_gemv_norm,
    "kern_gemv_bf16_p4_silu_n": k_gemv_silu_norm, "kern_gemv_bf16_b4_d": k_gemv_norm,
    "kern_gemv_bf16_b4_silu_d": k_gemv_silu_norm, "kern_gemv_bf16_p4_d": k_gemv_norm,
    "kern_gemv_bf16_p4_silu_d": k_gemv_silu_norm, "kern_gemv_e4m3_b128": k_gemv_e4m3_b128,
    "kern_dequant_e4m3_b128": k_dequant_e4m3_b128, "kern_quant_e4m3_b128": k_quant_e4m3_b128,
    "kern_gemv_e4m3_row": k_gemv_e4m3_row, "kern_dequant_e4m3_row": k_dequant_e4m3_row, **F32_KERNELS,
}  # fmt: skip


def kv_element_bytes(manifest: Manifest) -> int:
    """Bytes of one `kv` state element, as the kernels that address the state read it (4 for the f32
    entries, else 2); the manifest's kernels must agree."""
    sizes = {4 if la.entry in F32_STATE_ENTRIES else 2
             for op in manifest.ops.values() for la in op.impl.launches
             if any(p.kind == "state" for p in _launch_params(la, op.params))}
    assert len(sizes) <= 1, f"kernels read the kv state with element sizes {sorted(sizes)}"
    return sizes.pop() if sizes else 2


def _launch_params(launch: object, op_params: Sequence[Any]) -> Sequence[Any]:
    own = launch.params if isinstance(launch, KernelLaunch) else None
    return own if own is not None else op_params


def kv_token_bytes(manifest: Manifest) -> int:
    """Bytes per token of the `kv` state, the one paged state the interpreter holds."""
    bpt = manifest.states["kv"].bytes_per_token
    if bpt is None:
        raise KeyError("the interpreter runs manifests whose kv state is paged (bytes_per_token)")
    return bpt


def model_of(manifest: Manifest | Mapping[str, Any]) -> Manifest:
    """The kern_manifest model of `manifest`: a model as it is (`kern_runtime.read_manifest`'s), a
    generated manifest's plain JSON parsed."""
    return manifest if isinstance(manifest, Manifest) else parse_manifest(json.dumps(manifest))


# --------------------------------------------------------------------------------------------
# The test model.

UNTIED_CONFIG: dict[str, Any] = {**QWEN3_TINY_CONFIG, "num_hidden_layers": 3, "tie_word_embeddings": False,
                                 "max_position_embeddings": 1024}
"""An untied variant with GQA group 2 and a 3rd layer: exercises lm_head and layer offsets."""


def untied_weights(root: Path) -> dict[str, np.ndarray]:
    """UNTIED_CONFIG's random checkpoint (seed 11) under `root`, as float32 arrays."""
    path, _ = random_checkpoint(UNTIED_CONFIG, seed=11, name="interp", root=root)
    return read_checkpoint(path)


def random_prompt(n: int) -> list[int]:
    """`n` token ids of UNTIED_CONFIG's vocabulary, the same for the same `n`."""
    return [int(x) for x in np.random.default_rng(n).integers(0, UNTIED_CONFIG["vocab_size"], size=n)]


# --------------------------------------------------------------------------------------------
# The interpreter.


class Interp:
    """Buffers and the KV state of one manifest, with `run(program, vars)`, `write_input` and
    `read_output` shaped like kern_runtime's."""

    def __init__(self, manifest: Manifest | Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                 capacity: int, collective: Callable[[str, Sequence[Any], Mapping[str, int]], None] | None = None) -> None:
        """`collective` runs the NCCL externs of a tensor-parallel rank (`kern_interp.collectives`);
        without one a manifest with collectives cannot run."""
        self.model = model_of(manifest)
        self.collective = collective
        self.m: Mapping[str, Any] = manifest_to_json(self.model) if isinstance(manifest, Manifest) else manifest
        """The plain JSON the interpreter walks (`manifest_to_json` of a model)."""
        m = self.m
        self.tensors = tensors
        self.capacity = capacity
        env = {v: spec["max"] for v, spec in m["vars"].items()}
        self.mem: dict[str, np.ndarray] = {}
        for name, b in m["buffers"].items():
            n = int(np.prod([env[d] if isinstance(d, str) else d for d in b["shape"]]))
            self.mem[name] = np.zeros(n, dtype=_NP[b["dtype"]])
            if b["kind"] in ("weight", "source") and b.get("bind"):
                self.mem[name][:] = np.concatenate([tensors[s["tensor"]].reshape(-1) for s in b["bind"]])
        # NOTE: the runtime's pool holds whole pages (the block table's stride), as many as `capacity`
        # tokens need; kern_runtime's input-domain check bounds the writes by those token slots.
        page = next(b["domain"]["stride"] for b in m["buffers"].values() if b.get("fill") == "blocks")
        slots = -(-capacity // page) * page
        self.kv_elem = kv_element_bytes(self.model)
        self.kv = np.zeros(slots * kv_token_bytes(self.model) // self.kv_elem, dtype=F32)
        self.domains = kr_domains.input_domains(self.model,
                                                {"kv": kr_domains.StateUnits(slots, f"{slots} token slots")})
        self.scratch = {(op, s): np.zeros(int(np.prod(sc["shape"])), dtype=_NP[sc["dtype"]])
                        for op, spec in m["ops"].items() for s, sc in spec["impl"].get("scratch", {}).items()}
        for name in sorted(n for n, p in m["programs"].items() if p.get("derive")):
            self.run(name, {})  # NOTE: the unbound weights, from the sources (kept: the interpreter frees nothing)
        for name, p in m["programs"].items():
            if p.get("once"):
                self.run(name, {})

    def write_input(self, name: str, values: Sequence[int] | np.ndarray) -> None:
        assert self.m["buffers"][name]["kind"] == "input"
        arr = np.asarray(values)
        if name in self.domains:
            kr_domains.check_domain(name, self.domains[name], arr)
        self.mem[name][: arr.size] = arr.reshape(-1)

    def read_output(self, name: str) -> np.ndarray:
        assert self.m["buffers"][name]["kind"] == "output"
        return self.mem[name].copy()

    def _arg(self, a: Mapping[str, Any], env: Mapping[str, int]) -> Any:
        if "buf" in a:
            b = self.m["buffers"][a["buf"]]
            return (self.mem[a["buf"]], a.get("offset", 0) // _SIZE[b["dtype"]])
        if "state" in a:
            return (self.kv, a.get("offset", 0) // self.kv_elem)
        if "var" in a:
            return env[a["var"]]
        ((_, value),) = a.items()
        return value

    def _rows(self, program: str, env: Mapping[str, int]) -> int:
        """The rows a program's kernels run over: its batch's rows var, `rows` for a batch of many
        one-row sequences, else `tokens`."""
        batch = self.m["programs"][program].get("batch") or {}
        if isinstance(batch.get("rows"), str):
            return env[batch["rows"]]
        return env.get("rows", 1) if batch.get("groups", 1) > 1 else env.get("tokens", 1)

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        env = {v: vars.get(v, 1) for v in self.m["vars"]}
        t = self._rows(program, env)
        for call in self.m["programs"][program]["calls"]:
            op = self.m["ops"][call["op"]]
            values = [self._arg(a, env) for a in call["args"]]
            for launch in op["impl"]["launches"]:
                if not _inside(launch.get("when"), env):
                    continue
                args = values if "args" not in launch else [self._launch_arg(call["op"], la, values) for la in launch["args"]]
                if launch["entry"] == "extern:cublaslt_bf16_tn":
                    k_linear(t, *args)
                elif launch["entry"].startswith("extern:nccl_"):
                    assert self.collective is not None, f"{launch['entry']}: a rank's collective is needed"
                    self.collective(launch["entry"], args, env)
                else:
                    KERNELS[launch["entry"]](t, *args)

    def _launch_arg(self, op: str, la: Mapping[str, Any], values: list[Any]) -> Any:
        if "param" in la:
            return values[la["param"]]
        if "scratch" in la:
            return (self.scratch[(op, la["scratch"])], 0)
        ((_, value),) = la.items()
        return value


def _inside(when: Mapping[str, Any] | None, env: Mapping[str, int]) -> bool:
    """A launch's `when`: its var in [min, max] (inclusive, missing ends open); no `when`: always."""
    if when is None:
        return True
    v = env[when["var"]]
    return (when.get("min") is None or v >= when["min"]) and (when.get("max") is None or v <= when["max"])


def greedy(interp: Interp, prompt: Sequence[int], steps: int, chunk: int, *,
           head: bool = False) -> tuple[list[int], np.ndarray]:
    """kern-run's sequence of calls, by the serving roles, on the interpreter: tokens and the
    first token's logits. `head` (a manifest with a head program, a prompt of 2 tokens or more):
    the chunks take the last prompt token too and the head program gives the first token."""
    import kern_runtime as kr

    proto = kr.serving_roles(interp.model)
    if head:
        assert proto.head_program is not None and proto.head_row is not None and len(prompt) >= 2
    table = np.zeros(proto.blocks_len, dtype=np.int64)
    used = -(-interp.capacity // proto.page_tokens)
    table[:used] = np.arange(used)  # the pages of `capacity` tokens; the rest page 0, never read
    interp.write_input(proto.blocks, table)

    def stage(ids: Sequence[int], start: int) -> None:
        pos = np.arange(start, start + len(ids))
        interp.write_input(proto.token, ids)
        interp.write_input(proto.position, pos)
        interp.write_input(proto.slot, pos)
        interp.write_input(proto.seq_len, [start + len(ids)])

    chunks = kr.prefill_chunks(len(prompt), chunk, last=head)
    for a, b in chunks:
        stage(prompt[a:b], a)
        interp.run(proto.chunk_program, {proto.chunk_var: b - a})
    stage(prompt[-1:], len(prompt) - 1)
    if head:
        interp.write_input(proto.head_row, [chunks[-1][1] - chunks[-1][0] - 1])
    elif proto.start_program:
        interp.run(proto.start_program, {})
    out: list[int] = []
    first = np.empty(0)
    for i in range(steps):
        program = proto.head_program if head and i == 0 else proto.step_program
        assert program is not None
        interp.run(program, proto.step_vars)
        if i == 0:
            first = interp.read_output("logits").copy()
        out.append(int(interp.read_output(proto.next_token)[0]))
        if proto.start_program is None:
            stage([out[-1]], len(prompt) + i)
    return out, first


# --------------------------------------------------------------------------------------------
# An independent numpy Qwen3 (Hugging Face semantics, float32).


def reference_logits(cfg: Mapping[str, Any], w: Mapping[str, np.ndarray], ids: Sequence[int]) -> np.ndarray:
    """Logits of the last position of `ids`."""
    nq, nkv, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // nq
    n = len(ids)
    inv = (1.0 / np.power(np.float64(cfg["rope_theta"]), np.arange(0, d, 2) / d)).astype(F32)
    ang = np.arange(n, dtype=F32)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x: np.ndarray) -> np.ndarray:  # [n, h, d]
        rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    h = w["model.embed_tokens.weight"][list(ids)]
    causal = np.triu(np.ones((n, n), bool), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nq, d)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, d)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, d)
        q = rope(_rms(q, w[p + "self_attn.q_norm.weight"], eps))
        k = rope(_rms(k, w[p + "self_attn.k_norm.weight"], eps))
        k, v = np.repeat(k, nq // nkv, 1), np.repeat(v, nq // nkv, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(F32(d))
        s = np.where(causal[None], -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(n, nq * d)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(h[-1:], w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (x @ head.T)[0].astype(F32)


def reference_greedy(cfg: Mapping[str, Any], w: Mapping[str, np.ndarray], prompt: Sequence[int],
                     steps: int) -> tuple[list[int], np.ndarray]:
    ids = list(prompt)
    first = np.empty(0)
    for i in range(steps):
        logits = reference_logits(cfg, w, ids)
        if i == 0:
            first = logits
        ids.append(int(np.argmax(logits)))
    return ids[len(prompt) :], first
