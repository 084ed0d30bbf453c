"""Peers and NCCL collectives on GPUs: a one-rank communicator's four collectives x two dtypes
against their numpy definitions (eager and in a CUDA graph), export then import in one process
(two ranks on one GPU read each other's bytes), the multicast kernel refused at load; and the
same over two GPUs (`gpus(2)`: deselected unless `--multi-gpu`, which fails them on a host with
fewer)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import kern_runtime as kr

from .helpers import build
from .helpers import peer_manifests as pm

pytestmark = pytest.mark.gpu
FIXTURES = Path(__file__).parent / "fixtures" / "sass"
T = TypeVar("T")


class _NoTensors:
    def get(self, name: str) -> None:
        return None

    def names(self) -> list[str]:
        return []


@pytest.fixture(scope="module")
def kdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kernels")
    build.build_cuda(out)
    # NOTE: loaded (and refused by the scan), never launched.
    subprocess.run([build.nvcc(), "-cubin", "-arch=sm_90", "-o", str(out / "multicast.cubin"),
                    str(FIXTURES / "multicast.cu")], check=True)
    return out


def _load(doc: dict[str, Any], kdir: Path, tmp: Path, ranks: int, gpus: Sequence[int]) -> list[kr.Runtime]:
    path = tmp / f"{doc['model']}-{ranks}.json"
    path.write_text(json.dumps(doc))
    out: list[kr.Runtime] = []
    try:
        for r in range(ranks):
            rt = kr.Runtime.load(path, kdir, gpu=gpus[r], ranks={"tp": r})
            rt.load_weights(_NoTensors())
            out.append(rt)
    except BaseException:
        for rt in out:
            rt.close()
        raise
    return out


@pytest.fixture
def opened() -> Iterator[list[kr.Runtime]]:
    held: list[kr.Runtime] = []
    yield held
    for rt in held:
        rt.close()


def _each(runtimes: Sequence[kr.Runtime], fn: Callable[[kr.Runtime, int], T]) -> list[T]:
    """fn(rt, rank) on one thread per rank (each rank's NCCL calls may wait for the others')."""
    def one(r: int) -> T:
        runtimes[r].make_current()
        return fn(runtimes[r], r)

    with ThreadPoolExecutor(max_workers=len(runtimes)) as pool:
        return list(pool.map(one, range(len(runtimes))))


def _write(rt: kr.Runtime, dt: str, values: np.ndarray) -> None:
    rt.write_input(f"send_{dt}", values if dt == "f32" else pm.to_bf16(values))


def _read(rt: kr.Runtime, dt: str, n: int) -> np.ndarray:
    got = rt.read_output(f"recv_{dt}", n)
    return got if dt == "f32" else pm.from_bf16(got)


def _round(runtimes: list[kr.Runtime], verb: str, dt: str, seed: int, graph: bool) -> None:
    """Every rank sends its inputs through `verb` (eager, or replaying the program's graph) and
    receives the definition's values."""
    program = f"{verb}_{dt}"
    sends = pm.inputs(len(runtimes), seed)
    want = [pm.expected(verb, sends, r) for r in range(len(runtimes))]

    def step(rt: kr.Runtime, r: int) -> np.ndarray:
        _write(rt, dt, sends[r])
        if graph:
            rt.replay(rt.capture_graph(program, {}), {})
        else:
            rt.run(program, {})
        return _read(rt, dt, len(want[r]))

    for r, got in enumerate(_each(runtimes, step)):
        np.testing.assert_array_equal(got, want[r], err_msg=f"{program} rank {r} graph={graph}")


def _check_collectives(runtimes: list[kr.Runtime]) -> None:
    for dt in pm.DTYPES:
        for verb in pm.VERBS:
            _round(runtimes, verb, dt, 1, graph=False)
            # NOTE: recv still holds the eager result; the graph's (other inputs) must overwrite it.
            _round(runtimes, verb, dt, 2, graph=True)


def test_one_rank_collectives_equal_their_definitions(kdir: Path, tmp_path: Path,
                                                      opened: list[kr.Runtime]) -> None:
    opened += _load(pm.collectives(1), kdir, tmp_path, 1, [0])
    (rt,) = opened
    with pytest.raises(kr.NotConnectedError, match=r"group\(s\) \['tp'\] not joined"):
        rt.run("allreduce_f32", {})
    kr.connect_local(opened)
    _check_collectives(opened)


def test_one_rank_connect_through_offer_bytes(kdir: Path, tmp_path: Path, opened: list[kr.Runtime]) -> None:
    opened += _load(pm.collectives(1), kdir, tmp_path, 1, [0])
    (rt,) = opened
    offer = kr.Offer.from_bytes(rt.offer().to_bytes())
    assert len(offer.nccl["tp"]) == 128
    rt.connect({"tp": [offer]})
    sends = pm.inputs(1, 3)
    _write(rt, "f32", sends[0])
    rt.run("allgather_f32", {})
    np.testing.assert_array_equal(_read(rt, "f32", pm.COUNT), sends[0][:pm.COUNT])


def _gather(runtimes: list[kr.Runtime]) -> None:
    ranks = len(runtimes)
    xs = [np.arange(pm.COUNT, dtype=np.float32) * (r + 2) - r for r in range(ranks)]
    for rt, x in zip(runtimes, xs, strict=True):
        rt.make_current()
        with pytest.raises(kr.NotConnectedError, match="peers"):
            rt.run("gather", {})
        rt.write_input("x", x)
        rt.run("fill", {})
        rt.synchronize()
    kr.connect_local(runtimes)
    for rt in runtimes:
        rt.make_current()
        rt.run("gather", {})
        np.testing.assert_array_equal(rt.read_output("out"), np.concatenate(xs))


def test_export_then_import_in_one_process_maps_the_same_bytes(kdir: Path, tmp_path: Path,
                                                               opened: list[kr.Runtime]) -> None:
    sha = build.sha256(kdir / "rt_test.cubin")
    opened += _load(pm.peer_gather(sha, 2), kdir, tmp_path, 2, [0, 0])
    handles = opened[0].export_handles()
    assert set(handles) == {"flags"} and handles["flags"].kind in ("fabric", "posix_fd")
    assert handles["flags"].nbytes >= pm.COUNT * 4
    _gather(opened)


def test_a_multicast_kernel_handed_a_peer_buffer_is_refused_at_load(kdir: Path, tmp_path: Path) -> None:
    doc = pm.multicast_gather(build.sha256(kdir / "rt_test.cubin"), build.sha256(kdir / "multicast.cubin"))
    path = tmp_path / "mc.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(kr.KernelArtifactError, match=r"'mc_sum' is handed a peer buffer .* LDGMC"):
        kr.Runtime.load(path, kdir)


@pytest.mark.gpus(2)
def test_two_rank_collectives_equal_their_definitions(kdir: Path, tmp_path: Path,
                                                      opened: list[kr.Runtime]) -> None:
    opened += _load(pm.collectives(2), kdir, tmp_path, 2, [0, 1])
    kr.connect_local(opened)
    _check_collectives(opened)


@pytest.mark.gpus(2)
def test_two_gpus_read_each_others_exports(kdir: Path, tmp_path: Path, opened: list[kr.Runtime]) -> None:
    sha = build.sha256(kdir / "rt_test.cubin")
    opened += _load(pm.peer_gather(sha, 2), kdir, tmp_path, 2, [0, 1])
    _gather(opened)
