"""kern_runtime on a GPU: our own kernels (nvcc, Triton) through manifests, checked against numpy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kern_runtime as kr
from kern_runtime import _driver as drv

from .helpers import build, manifests
from .test_weights import _st_bytes

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kernels")
    build.build_cuda(out)
    (out / "unrelated.bin").write_bytes(b"not a module, never loaded")
    return out


@pytest.fixture(scope="module")
def sha(kdir: Path) -> str:
    return build.sha256(kdir / "rt_test.cubin")


def _weights(path: Path, **override: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = {
        "w.a": rng.standard_normal((4, 8)).astype(np.float32),
        "w.b": rng.standard_normal((2, 8)).astype(np.float32),
        "g": rng.standard_normal((4, 2)).astype(np.float32),
        "u": rng.standard_normal((4, 2)).astype(np.float32),
        "h": rng.standard_normal(8).astype(np.float32),
        "s": rng.standard_normal(16).astype(np.float32),
    }
    t.update(override)
    path.write_bytes(_st_bytes(t))
    return t


@pytest.fixture
def basic(kdir: Path, sha: str, tmp_path: Path) -> Iterator[tuple[kr.Runtime, dict[str, np.ndarray]]]:
    m = build.write_manifest(tmp_path / "basic.json", manifests.basic(sha))
    t = _weights(tmp_path / "w.safetensors")
    rt = kr.Runtime.load(m, kdir)
    rt.load_weights(kr.Safetensors.open(tmp_path / "w.safetensors"), threads=3)
    yield rt, t
    rt.close()


def _f32(rt: kr.Runtime, name: str) -> np.ndarray:
    return rt.read_buffer(name).view(np.float32)


def test_weights_bind_derive_and_once(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    rt, t = basic
    w = np.concatenate([t["w.a"][1:3], t["w.b"]]).ravel()
    wi = np.concatenate([t["g"][0:2], t["u"][0:2], t["g"][2:4], t["u"][2:4]]).ravel()
    wc = t["w.a"][:, 2:4].ravel()
    np.testing.assert_array_equal(_f32(rt, "w"), w)
    np.testing.assert_array_equal(_f32(rt, "wi"), wi)
    np.testing.assert_array_equal(_f32(rt, "wc"), wc)
    np.testing.assert_array_equal(_f32(rt, "wh"), t["h"])
    np.testing.assert_array_equal(_f32(rt, "derived"), t["s"] * 2)
    np.testing.assert_array_equal(_f32(rt, "c"), t["s"] * 2 + 1)
    np.testing.assert_array_equal(_f32(rt, "hc"), t["h"])
    acc = w.copy()
    acc[:16] = wi
    acc[:8] = wc
    np.testing.assert_array_equal(_f32(rt, "acc"), acc)
    with pytest.raises(kr.ApiError, match="has no memory"):
        rt.read_buffer("src")  # sources live only inside load_weights


def test_run_arithmetic_and_prefix_writes(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    rt, _ = basic
    x = np.linspace(-4, 4, 1000, dtype=np.float32)
    rt.write_input("x", x)
    rt.run("main", {"n": 1000})
    np.testing.assert_array_equal(rt.read_output("y", 1000), _fma(x))
    np.testing.assert_array_equal(rt.read_output("o64", 1000), -(1 << 40) + 7 * np.arange(1000, dtype=np.int64))
    rt.write_input("x", np.full(10, 2.0, np.float32))
    rt.issue("main", {"n": 12})  # not a graph program: eager
    y = rt.read_output("y", 12)
    np.testing.assert_array_equal(y, [6.5] * 10 + list(_fma(x[10:12])))
    assert rt.read_output("y", 2).shape == (2,)


def _fma(x: np.ndarray) -> np.ndarray:
    """3x + 0.5 rounded once, as the kernel's fused multiply-add does."""
    return (3 * x.astype(np.float64) + 0.5).astype(np.float32)


def test_when_ranges_pick_launches(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    rt, _ = basic
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    rt.write_input("x", x)
    rt.run("pick", {"n": 16})
    np.testing.assert_array_equal(rt.read_output("y", 16), (10 * x[:16].astype(np.float64) + 0.5).astype(np.float32))
    rt.issue("pick", {"n": 17})
    np.testing.assert_array_equal(rt.read_output("y", 17), _fma(x[:17]))


def test_device_blobs_copy_device_to_device_and_to_host(
    basic: tuple[kr.Runtime, dict[str, np.ndarray]], kdir: Path, sha: str, tmp_path: Path
) -> None:
    rt1, t = basic
    w1, wi1, derived1 = _f32(rt1, "w"), _f32(rt1, "wi"), _f32(rt1, "derived")
    blobs = {
        "w.a": kr.TensorInfo("w.a", "f32", (4, 8), kr.DeviceBlob(rt1.buffer_address("w"), 128)),
        "w.b": kr.TensorInfo("w.b", "f32", (2, 8), kr.DeviceBlob(rt1.buffer_address("wi"), 64)),
        "h": kr.TensorInfo("h", "f32", (8,), kr.DeviceBlob(rt1.buffer_address("derived"), 32)),
    }
    mem = kr.Safetensors.parse(_st_bytes({k: t[k] for k in ("g", "u", "s")}))

    class Mixed:
        def get(self, name: str) -> kr.TensorInfo | None:
            return blobs.get(name) or mem.get(name)

        def names(self) -> Iterator[str]:
            yield from [*blobs, *mem.names()]

    m = build.write_manifest(tmp_path / "m.json", manifests.basic(sha))
    with kr.Runtime.load(m, kdir) as rt2:
        rt2.load_weights(Mixed())
        a = w1.reshape(4, 8)
        np.testing.assert_array_equal(_f32(rt2, "w"), np.concatenate([a[1:3].ravel(), wi1[:16]]))
        np.testing.assert_array_equal(_f32(rt2, "wc"), a[:, 2:4].ravel())
        np.testing.assert_array_equal(_f32(rt2, "wh"), derived1[:8])


def test_api_errors(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    rt, t = basic
    cases: list[tuple[Any, str]] = [
        (lambda: rt.run("nope", {}), "unknown program 'nope'"),
        (lambda: rt.run("main", {"n": 1025}), "outside 1..1024"),
        (lambda: rt.run("main", {}), "reads var 'n'"),
        (lambda: rt.run("prep", {}), "derive program"),
        (lambda: rt.write_input("x", np.zeros(4, np.float64)), "numpy float32"),
        (lambda: rt.write_input("x", np.zeros(1025, np.float32)), "holds 1024 elements"),
        (lambda: rt.write_input("y", np.zeros(4, np.float32)), "not an input"),
        (lambda: rt.read_output("y", 2000), "holds 1024 elements"),
        (lambda: rt.read_output("zz"), "unknown buffer 'zz'"),
        (lambda: rt.load_weights(kr.Safetensors.parse(_st_bytes(t))), "already called"),
    ]
    for action, match in cases:
        with pytest.raises(kr.ApiError, match=match):
            action()


def test_summary_lists_the_load(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    text = basic[0].summary()
    assert "manifest rt-basic" in text and "vars: n<=1024" in text and "program main: 2 calls" in text
    assert "weight 5 (" in text and "module t:" in text


def test_flipped_cubin_byte_is_kernel_artifact(kdir: Path, sha: str, tmp_path: Path) -> None:
    flipped = tmp_path / "k"
    flipped.mkdir()
    data = bytearray((kdir / "rt_test.cubin").read_bytes())
    data[len(data) // 2] ^= 0x40
    (flipped / "rt_test.cubin").write_bytes(bytes(data))
    m = build.write_manifest(tmp_path / "m.json", manifests.basic(sha))
    with pytest.raises(kr.KernelArtifactError, match=f"module 't': no file with sha256 {sha[:12]}"):
        kr.Runtime.load(m, flipped)


def test_wrong_param_size_is_kernel_artifact(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "m.json", manifests.basic(sha, n_param="i64"))
    with pytest.raises(kr.KernelArtifactError, match="entry 'rt_axpb': ABI mismatch, param 4 is 4 bytes"):
        kr.Runtime.load(m, kdir)


def test_wrong_weight_shape_leaves_runtime_loadable(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "m.json", manifests.basic(sha))
    with kr.Runtime.load(m, kdir) as rt:
        _weights(tmp_path / "bad.safetensors", **{"w.b": np.zeros((3, 8), np.float32)})
        with pytest.raises(kr.WeightArtifactError, match="buffer 'w' holds 128 bytes"):
            rt.load_weights(kr.Safetensors.open(tmp_path / "bad.safetensors"))
        with pytest.raises(kr.ApiError, match="load_weights before"):
            rt.run("main", {"n": 1})
        t = _weights(tmp_path / "good.safetensors")
        seen: list[tuple[int, int]] = []
        moved = rt.load_weights(kr.Safetensors.open(tmp_path / "good.safetensors"), progress=lambda d, n: seen.append((d, n)))
        np.testing.assert_array_equal(_f32(rt, "derived"), t["s"] * 2)
        assert moved == 128 + 64 + 32 + 32 + 64 and seen[-1] == (moved, moved)
        assert all(d <= n for d, n in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_failed_load_releases_memory(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "m.json", manifests.gemm({"id": 999999}))
    with kr.Runtime.load(build.write_manifest(tmp_path / "ok.json", manifests.basic(sha)), kdir):
        before = drv.mem_get_info()[0]
        for _ in range(3):
            with pytest.raises(kr.KernelArtifactError, match="pinned algo 999999"):
                kr.Runtime.load(m, kdir)
        assert abs(drv.mem_get_info()[0] - before) < (8 << 20)


def test_smem_cluster_and_tensormap(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "f.json", manifests.features(sha))
    with kr.Runtime.load(m, kdir) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        sx = np.arange(16384, dtype=np.float32)
        tin = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
        rt.write_input("sx", sx)
        rt.write_input("tin", tin)
        rt.run("main", {})
        np.testing.assert_array_equal(rt.read_output("sy"), sx[::-1])
        np.testing.assert_array_equal(rt.read_output("ranks"), [(i % 4) * 100 + 4 for i in range(8)])
        np.testing.assert_array_equal(rt.read_output("tout"), 2 * tin.ravel() + 5)


def test_one_entry_launched_by_two_ops_gets_the_larger_shared_memory(kdir: Path, sha: str, tmp_path: Path) -> None:
    """Two ops launch one entry with different dynamic shared memory, the larger one first in the
    manifest: the function's limit is the larger (the later op must not lower it), and both run."""
    doc = manifests.features(sha)
    small = json.loads(json.dumps(doc["ops"]["reverse"]))
    small["impl"]["launches"][0]["shared_mem"] = 50000
    doc["ops"] = {"reverse": doc["ops"]["reverse"], "reverse_small": small}
    doc["buffers"] = {"sx": doc["buffers"]["sx"], "sy": doc["buffers"]["sy"],
                      "sz": {"dtype": "f32", "shape": [12500], "kind": "output"}}
    doc["programs"] = {"main": {"calls": [
        {"op": "reverse", "args": [{"buf": "sx"}, {"buf": "sy"}, {"i32": 16384}]},
        {"op": "reverse_small", "args": [{"buf": "sx"}, {"buf": "sz"}, {"i32": 12500}]}]}}
    m = build.write_manifest(tmp_path / "two.json", doc)
    attr = drv.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    with kr.Runtime.load(m, kdir) as rt:
        funcs = rt._kernels.funcs  # pyright: ignore[reportPrivateUsage]
        assert {drv.func_attribute(f, attr) for f in funcs.values()} == {65536}
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        sx = np.arange(16384, dtype=np.float32)
        rt.write_input("sx", sx)
        rt.run("main", {})
        np.testing.assert_array_equal(rt.read_output("sy"), sx[::-1])
        np.testing.assert_array_equal(rt.read_output("sz"), sx[:12500][::-1])


def test_static_and_dynamic_shared_memory_past_48k_opt_in(kdir: Path, sha: str, tmp_path: Path) -> None:
    """`rt_tma_tile` has about 1 KiB of static shared memory; a launch of it with exactly 48 KiB of
    dynamic shared memory passes the 48 KiB default only together with the static part, so the
    runtime must still raise the function's limit (it did not when it compared the launch with
    48 KiB alone), and the kernel computes as before."""
    doc = manifests.features(sha)
    doc["ops"]["tma"]["impl"]["launches"][0]["shared_mem"] = 48 << 10
    m = build.write_manifest(tmp_path / "f.json", doc)
    attr = drv.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    with kr.Runtime.load(m, kdir) as rt:
        funcs = rt._kernels.funcs  # pyright: ignore[reportPrivateUsage]
        tma = next(f for (op, _), f in funcs.items() if op == "tma")
        assert drv.func_attribute(tma, attr) == 48 << 10
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        sx = np.arange(16384, dtype=np.float32)
        tin = np.random.default_rng(2).standard_normal((64, 32)).astype(np.float32)
        rt.write_input("sx", sx)
        rt.write_input("tin", tin)
        rt.run("main", {})
        np.testing.assert_array_equal(rt.read_output("sy"), sx[::-1])
        np.testing.assert_array_equal(rt.read_output("tout"), 2 * tin.ravel() + 5)


def test_carveout_sets_the_function_attribute(kdir: Path, sha: str, tmp_path: Path) -> None:
    """A launch's `carveout` becomes its function's preferred shared-memory carveout; the kernels
    still compute the same (it is only a hint)."""
    doc = manifests.features(sha)
    kernel_launches = [la for op in doc["ops"].values() for la in op["impl"]["launches"]
                       if not la["entry"].startswith("extern:")]
    for la in kernel_launches:
        la["carveout"] = 100
    m = build.write_manifest(tmp_path / "f.json", doc)
    attr = drv.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    with kr.Runtime.load(m, kdir) as rt:
        funcs = rt._kernels.funcs  # pyright: ignore[reportPrivateUsage]
        assert len(funcs) == len(kernel_launches)
        assert {drv.func_attribute(f, attr) for f in funcs.values()} == {100}
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        sx = np.arange(16384, dtype=np.float32)
        rt.write_input("sx", sx)
        rt.write_input("tin", np.ones((64, 32), np.float32))
        rt.run("main", {})
        np.testing.assert_array_equal(rt.read_output("sy"), sx[::-1])


def test_graph_replay_equals_eager_over_400_launches(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "c.json", manifests.chain(sha))
    with kr.Runtime.load(m, kdir) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        x = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
        rt.write_input("x", x)
        rt.run("chain", {})
        eager = rt.read_output("y")
        rt.write_input("x", np.zeros(4096, np.float32))
        rt.run("chain", {})
        assert not np.array_equal(rt.read_output("y"), eager)
        rt.write_input("x", x)
        rt.issue("chain", {})
        graph = rt.capture_graph("chain", {})
        assert graph.launches == 400
        np.testing.assert_array_equal(rt.read_output("y"), eager)
        rt.replay(graph, {})
        rt.replay(graph, {})
        np.testing.assert_array_equal(rt.read_output("y"), eager)
        with pytest.raises(kr.ApiError, match="declares graph"):
            rt.cache_graphs("chain", 2)


def test_time_calls_times_each_call_of_an_eager_run(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "c.json", manifests.chain(sha, calls=50))
    with kr.Runtime.load(m, kdir) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
        rt.write_input("x", x)
        rt.run("chain", {})
        eager = rt.read_output("y")
        times, held = rt.time_calls("chain", {})
        assert held and [label for label, _ms in times] == ["first"] + ["mix"] * 49
        assert all(0 < ms < 1e3 for _label, ms in times)
        np.testing.assert_array_equal(rt.read_output("y"), eager)  # it ran the same program
        with pytest.raises(kr.ApiError, match="unknown program"):
            rt.time_calls("chain", {}, before="nope")


def test_copy_rate_moves_bytes() -> None:
    rate = kr.copy_rate(0, nbytes=64 << 20, reps=3)
    assert 1e9 < rate < 1e14  # bytes per second: a device copy, not a host one nor nothing
    with pytest.raises(kr.ApiError, match="does not exist"):
        kr.copy_rate(drv.device_count())


def test_graph_vars_must_match_capture(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    rt, _ = basic
    g = rt.capture_graph("main", {"n": 8})
    assert rt.capture_graph("main", {"n": 8}) is g
    with pytest.raises(kr.ApiError, match="captured at"):
        rt.replay(g, {"n": 9})


def test_graph_cache_replays_a_program_from_its_second_use(basic: tuple[kr.Runtime, dict[str, np.ndarray]]) -> None:
    """issue() of a program with a graph cache: a length's first use runs eagerly, the second
    captures, later ones replay; every replay reads the inputs written before it; the least
    recently used graph leaves first; limit 0 turns the cache off."""
    rt, _ = basic
    with pytest.raises(kr.ApiError, match="unknown program"):
        rt.cache_graphs("mian", 2)
    with pytest.raises(kr.ApiError, match="int >= 0"):
        rt.cache_graphs("main", -1)
    assert rt.graph_cache("main") is None
    rt.cache_graphs("main", 2)
    rng = np.random.default_rng(5)
    for n in (8, 8, 8, 9, 9, 10, 10, 8):
        x = rng.standard_normal(1000).astype(np.float32)
        rt.write_input("x", x)
        rt.issue("main", {"n": n})
        np.testing.assert_array_equal(rt.read_output("y", n), _fma(x[:n]))
    assert rt.graph_cache("main") == kr.GraphCacheStats(limit=2, cached=2, hits=1, eager=4, captures=3, evictions=1)
    rt.cache_graphs("main", 0)
    assert rt.graph_cache("main") is None
    x = rng.standard_normal(1000).astype(np.float32)
    rt.write_input("x", x)
    rt.issue("main", {"n": 9})
    np.testing.assert_array_equal(rt.read_output("y", 9), _fma(x[:9]))


def _bf16(a: np.ndarray) -> np.ndarray:
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


@pytest.fixture(scope="module")
def gemm_rt(kdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[kr.Runtime, np.ndarray]]:
    d = tmp_path_factory.mktemp("gemm")
    m = build.write_manifest(d / "g.json", manifests.gemm())
    w = _bf16(np.random.default_rng(3).standard_normal((256, 512)) * 0.05)
    rt = kr.Runtime.load(m, kdir)
    rt.load_weights(kr.Safetensors.parse(_st_bytes({"w": w})))
    yield rt, w
    rt.close()


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    tol = 2.0**-7 * np.abs(ref) + 1e-2
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} outside bf16 tolerance, max err {np.abs(got - ref).max()}"


@pytest.mark.parametrize("m", [1, 7, 64, 709, 2048])
def test_gemm_extern_against_float64(gemm_rt: tuple[kr.Runtime, np.ndarray], m: int) -> None:
    rt, wb = gemm_rt
    w = _from_bf16(wb).astype(np.float64)
    ab = _bf16(np.random.default_rng(m).standard_normal((m, 640)))
    rt.write_input("a", ab)
    a_full = _from_bf16(ab).astype(np.float64)
    a_plain = _from_bf16(ab.ravel()[: m * 512].reshape(m, 512)).astype(np.float64)
    rt.run("plain", {"m": m})
    c = _from_bf16(rt.read_buffer("c").view(np.uint16)[: m * 256].reshape(m, 256))
    _close(c, a_plain @ w.T)
    rt.run("f32", {"m": m})
    cf = rt.read_buffer("cf").view(np.float32)[: m * 256].reshape(m, 256)
    _close(cf, a_plain @ w.T)
    rt.run("strided", {"m": m})
    cs = _from_bf16(rt.read_buffer("c").view(np.uint16)[: m * 384].reshape(m, 384))
    ref = a_full[:, :512] @ w.T
    _close(cs[:, 64:320], ref)
    before = cs.astype(np.float64)
    rt.run("acc", {"m": m})
    ca = _from_bf16(rt.read_buffer("c").view(np.uint16)[: m * 384].reshape(m, 384))
    _close(ca[:, :256], before[:, :256] + ref)
    _close(ca[:, 256:], before[:, 256:])


def test_gemm_graph_capture(gemm_rt: tuple[kr.Runtime, np.ndarray]) -> None:
    rt, _ = gemm_rt
    ab = _bf16(np.random.default_rng(9).standard_normal((7, 640)))
    rt.write_input("a", ab)
    rt.run("plain", {"m": 7})
    eager = rt.read_buffer("c").copy()
    rt.replay(rt.capture_graph("plain", {"m": 7}), {"m": 7})
    np.testing.assert_array_equal(rt.read_buffer("c"), eager)


def test_pinned_algo_from_heuristic_is_bit_identical(
    gemm_rt: tuple[kr.Runtime, np.ndarray], kdir: Path, tmp_path: Path
) -> None:
    rt, wb = gemm_rt
    [(label, algo)] = rt.gemm_algos("plain", {"m": 64})
    assert label == "gemm" and algo["id"] >= 0
    ab = _bf16(np.random.default_rng(5).standard_normal((64, 640)))
    rt.write_input("a", ab)
    rt.run("plain", {"m": 64})
    want = rt.read_buffer("c")[: 64 * 256 * 2].copy()
    m = build.write_manifest(tmp_path / "pinned.json", manifests.gemm(algo))
    with kr.Runtime.load(m, kdir) as pinned:
        pinned.load_weights(kr.Safetensors.parse(_st_bytes({"w": wb})))
        assert pinned.gemm_algos("plain", {"m": 64}) == [("gemm", algo)]
        pinned.write_input("a", ab)
        pinned.run("plain", {"m": 64})
        np.testing.assert_array_equal(pinned.read_buffer("c")[: 64 * 256 * 2], want)


def test_nvcc_fatbin_module_loads(kdir: Path, tmp_path: Path) -> None:
    d = tmp_path / "fat"
    d.mkdir()
    fat = build.build_cuda(d, "fatbin")
    m = build.write_manifest(tmp_path / "c.json", manifests.chain(build.sha256(fat), calls=3))
    with kr.Runtime.load(m, d) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        rt.write_input("x", np.ones(4096, np.float32))
        rt.run("chain", {})
        assert rt.read_output("y", 4)[0] != 0


def test_same_named_triton_instances_told_apart_by_abi(tmp_path: Path) -> None:
    d = tmp_path / "tri"
    d.mkdir()
    fat, info = build.build_triton_pair(d)
    assert info["names"][0] == info["names"][1] == "add_k"
    layouts = _layouts(fat)
    extra = min(len(lay) for lay in layouts) - 3
    m = build.write_manifest(tmp_path / "t.json", manifests.same_name(build.sha256(fat), extra))
    with kr.Runtime.load(m, d) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        x = np.arange(1024, dtype=np.float32)
        y = np.full(1024, 0.5, np.float32)
        rt.write_input("x", x)
        rt.write_input("y", y)
        rt.run("main", {})
        np.testing.assert_array_equal(rt.read_output("oa"), 2 * x + y)
        np.testing.assert_array_equal(rt.read_output("ob"), 3 * x + y)


def _layouts(fat: Path) -> list[list[tuple[int, int]]]:
    from contextlib import ExitStack

    from kern_runtime.kernels import LoadedModule

    drv.init()
    dev = drv.device(0)
    drv.primary_context(dev)
    try:
        with ExitStack() as stack:
            mod = LoadedModule.load(stack, "probe", "0" * 64, fat.read_bytes(), 90)
            return [list(inst.layout) for inst in mod._functions["add_k"]]  # pyright: ignore[reportPrivateUsage]
    finally:
        drv.release_primary_context(dev)


def test_load_over_claims_identical_weights(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "m.json", manifests.basic(sha))
    t = _weights(tmp_path / "w.safetensors")
    rt = kr.Runtime.load(m, kdir)
    rt.load_weights(kr.Safetensors.open(tmp_path / "w.safetensors"))
    addr = rt.buffer_address("w")
    resident = rt.into_resident()
    assert "w" in resident.names and "wh" not in resident.names
    with pytest.raises(kr.ApiError, match="closed"):
        rt.run("main", {"n": 1})
    rt2 = kr.Runtime.load(m, kdir, over=resident)
    try:
        assert rt2.buffer_address("w") == addr and "claimed from resident: 4" in rt2.summary()
        only_host = {k: v for k, v in t.items() if k in ("h", "s")}
        rt2.load_weights(kr.Safetensors.parse(_st_bytes(only_host)))
        np.testing.assert_array_equal(_f32(rt2, "wc"), t["w.a"][:, 2:4].ravel())
        np.testing.assert_array_equal(_f32(rt2, "c"), t["s"] * 2 + 1)
    finally:
        rt2.close()


def test_park_and_wake_round_trip_through_the_host_tier(kdir: Path, sha: str, tmp_path: Path) -> None:
    """A checkpoint parked to pinned host memory, its device pages overwritten, woken into fresh
    pages: the same bytes, pages and slot; a full host tier refuses with nothing kept."""
    m = build.write_manifest(tmp_path / "p.json", manifests.pooled(sha))
    page = 16 * 4096
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=256, seqs=1)) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        with pytest.raises(kr.ApiError, match="no host tier"):
            rt.host  # noqa: B018
        host = rt.enable_host_tier(8 << 20)
        assert host.units == (8 << 20) // page and host.slot_units == 16
        lease = rt.lease(32)
        assert lease.state_slot is not None
        rng = np.random.default_rng(6)
        kv = [rng.integers(0, 255, page, dtype=np.uint8) for _ in lease.pages]
        state = rng.integers(0, 255, 1 << 20, dtype=np.uint8)
        for p, data in zip(lease.pages, kv, strict=True):
            rt.write_state("kv", p * page, data)
        rt.write_state("ssm", lease.state_slot << 20, state)
        cp = rt.checkpoint(lease, 32)
        parked = rt.park(cp)
        rt.synchronize()
        old_pages = list(cp.pages)
        cp.release()
        lease.release()
        for p in old_pages:  # the device copies are gone: overwrite them
            rt.write_state("kv", p * page, np.full(page, 0xA5, np.uint8))
        woken = rt.wake(parked, 32)
        assert woken.state_slot is not None and len(woken.pages) == 2
        for p, data in zip(woken.pages, kv, strict=True):
            np.testing.assert_array_equal(rt.read_state("kv", p * page, page), data)
        np.testing.assert_array_equal(rt.read_state("ssm", woken.state_slot << 20, 1 << 20), state)
        with pytest.raises(kr.ApiError, match="already enabled"):
            rt.enable_host_tier(1 << 20)
        assert host.used == 2 + 16


def test_pool_leases_checkpoints_and_restores_on_vmm(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "p.json", manifests.pooled(sha))
    page = 16 * 4096
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=256, seqs=1)) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        # NOTE: the initial plan maps the budget's chunks as pages; pages_max counts what the arena
        # could hold were every chunk a page.
        assert "pages of 16 tokens" in rt.summary() and 2 <= rt.pool.pages_free <= rt.pool.pages_max
        rt.run("stamp", {})
        stamp = 7 + np.arange(128, dtype=np.int64)
        np.testing.assert_array_equal(rt.read_state("kv", 32768, 1024).view(np.int64), stamp)
        np.testing.assert_array_equal(rt.read_state("ssm", 1 << 19, 1024).view(np.int64), stamp + 2)
        lease = rt.lease(32)
        slot = lease.state_slot
        assert slot is not None and len(lease.pages) == 2
        for p in lease.pages:
            assert not rt.read_state("kv", p * page, page).any()
        pattern = np.random.default_rng(4).integers(0, 255, page, dtype=np.uint8)
        state = np.random.default_rng(5).integers(0, 255, 1 << 20, dtype=np.uint8)
        rt.write_state("kv", lease.pages[1] * page, pattern)
        rt.write_state("ssm", slot << 20, state)
        cp = rt.checkpoint(lease, 20)
        assert cp.pages[0] == lease.pages[0] and cp.pages[1] != lease.pages[1] and cp.state_slot is not None
        np.testing.assert_array_equal(rt.read_state("kv", cp.pages[1] * page, page), pattern)
        np.testing.assert_array_equal(rt.read_state("ssm", cp.state_slot << 20, 1 << 20), state)
        child = rt.restore(cp, 20, 64)
        assert child.pages[0] == lease.pages[0] and len(child.pages) == 4 and child.state_slot is not None
        np.testing.assert_array_equal(rt.read_state("kv", child.pages[1] * page, page), pattern)
        np.testing.assert_array_equal(rt.read_state("ssm", child.state_slot << 20, 1 << 20), state)
        assert not rt.read_state("kv", child.pages[2] * page, page).any()
        extra = [rt.lease(16) for _ in range(3)]  # past the first 3 slots: a remap lands
        assert rt.pool.remaps >= 1 and all(x.state_slot is not None for x in extra)
        with pytest.raises(kr.ApiError, match="outside"):
            rt.read_state("kv", -1, 8)


def test_zero_state_zeroes_its_range_on_the_device_and_nothing_beside_it(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "p.json", manifests.pooled(sha))
    page = 16 * 4096
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=256, seqs=1)) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        lease = rt.lease(32)
        start = lease.pages[0] * page
        pattern = np.random.default_rng(8).integers(1, 255, 2 * page, dtype=np.uint8)
        rt.write_state("kv", start, pattern)
        rt.zero_state("kv", start + 1000, page)
        got = rt.read_state("kv", start, 2 * page)
        want = pattern.copy()
        want[1000:1000 + page] = 0
        np.testing.assert_array_equal(got, want)
        with pytest.raises(kr.ApiError, match="outside"):
            rt.zero_state("kv", -1, 8)
        with pytest.raises(kr.ApiError, match="unknown state"):
            rt.zero_state("nope", 0, 8)
        np.testing.assert_array_equal(rt.read_state("kv", start, 2 * page), want)


def test_write_input_refuses_values_outside_the_domain_and_keeps_the_last_write(
    kdir: Path, sha: str, tmp_path: Path
) -> None:
    """The block table indexes the pool's pages (`index_into` kv, stride 16): a page number the pool
    does not have is a DomainError naming the element, and the buffer keeps the last good write."""
    m = build.write_manifest(tmp_path / "p.json", manifests.pooled(sha))
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=256, seqs=1)) as rt:
        pages = rt.pool.pages_max
        good = (np.arange(256, dtype=np.int32) * 7) % pages
        rt.write_input("bt", good)
        bad = good.copy()
        bad[70] = pages
        with pytest.raises(kr.DomainError, match=rf"input 'bt' element 70 is {pages}, outside its domain \[0, {pages - 1}\]"):
            rt.write_input("bt", bad)
        with pytest.raises(kr.DomainError, match="element 0 is -1"):
            rt.write_input("bt", np.full(4, -1, np.int32))
        np.testing.assert_array_equal(rt.read_buffer("bt").view(np.int32), good)
