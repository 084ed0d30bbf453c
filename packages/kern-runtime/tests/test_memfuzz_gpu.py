"""The memory fuzz (helpers/memfuzz.py) on a GPU: kern_runtime.Runtime's own pool, host tier,
staged wakes and remaps under two paged states (8 and 4 slices a page) with a per-seq state, and
without it; 2,000 operations per seed, stamps checked byte for byte, everything back to zero at
the end. The CPU twin is test_memfuzz.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import kern_runtime as kr

from .helpers import build, memfuzz
from .test_memfuzz import CAPACITY, HOST, SEEDS, fuzz_manifest
from .test_weights import _st_bytes  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.gpu

OPS = 2000


@pytest.fixture(scope="module")
def kdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kernels")
    build.build_cuda(out)
    return out


@pytest.mark.parametrize("stateful", [True, False], ids=["per-seq", "paged-only"])
@pytest.mark.parametrize("seed", SEEDS)
def test_memory_fuzz_on_the_gpu(kdir: Path, tmp_path: Path, seed: int, stateful: bool) -> None:
    doc = fuzz_manifest(build.sha256(kdir / "rt_test.cubin"), stateful)
    m = build.write_manifest(tmp_path / "fuzz.json", doc)
    t0 = time.perf_counter()
    with kr.Runtime.load(m, kdir, capacity=CAPACITY) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        rt.reserve_host(*HOST)
        stats = memfuzz.MemoryFuzz(rt, memfuzz.layout_of(doc), seed).run(OPS, check_rate=0.5)
    print(f"seed {seed} {'per-seq' if stateful else 'paged-only'}: {OPS} operations in "
          f"{time.perf_counter() - t0:.1f} s: {dict(sorted(stats.ops.items()))}")
    for op in ("restore", "fork-in-page", "park-room", "park-compute", "park-now", "wake", "wake_now", "pressure"):
        assert stats.ops.get(op, 0) > 0, f"seed {seed}: no {op} in {OPS} operations: {stats.ops}"
