"""State arena sizing (pure) and alignment."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from kern_manifest import State
from kern_runtime import memory
from kern_runtime.memory import align_up, state_size

MIB = 1 << 20
GRAN = 2 * MIB


def test_align_up() -> None:
    assert [align_up(n, 256) for n in (0, 1, 256, 257)] == [0, 256, 256, 512]


def test_paged_state_rounds_tokens_up_to_whole_chunks() -> None:
    # Qwen3-4B's KV: 36 layers x 2 x 8 heads x 128 x 2 bytes a token, 16-token pages (2.25 MiB).
    bpt = 36 * 2 * 8 * 128 * 2
    nbytes, chunk, note = state_size(State(bytes_per_token=bpt), 4096, 1, 16, GRAN)
    assert chunk == 64 * MIB and nbytes == 9 * 64 * MIB and note == f"paged, {nbytes // bpt // 16 * 16} tokens"
    big = state_size(State(bytes_per_token=49 * MIB // 16), 16, 1, 16, GRAN)
    assert big[1] == 24 * MIB and big[0] == 72 * MIB


def test_per_seq_state_gets_seqs_plus_two_slots() -> None:
    nbytes, chunk, note = state_size(State(bytes_per_seq=10 * MIB), 4096, 3, 1, GRAN)
    assert chunk == 4 * MIB and nbytes == 52 * MIB and note == "per-seq, 5 slots"


def test_fixed_state_takes_its_bytes() -> None:
    assert state_size(State(bytes=3 * MIB), 4096, 1, 1, GRAN) == (3 * MIB, 4 * MIB, "fixed")


# ---- NUMA placement of the host tier's block ---------------------------------------------------


class FakePolicy:
    def __init__(self, saved: tuple[int, int] | None = (0, 0), allow: bool = True) -> None:
        self.saved = saved
        self.allow = allow
        self.calls: list[tuple[int, int]] = []

    def get(self) -> tuple[int, int] | None:
        return self.saved

    def set(self, mode: int, mask: int) -> bool:
        self.calls.append((mode, mask))
        return self.allow


def _sysfs(root: Path, pci: str, text: str) -> Path:
    d = root / "bus" / "pci" / "devices" / pci
    d.mkdir(parents=True)
    (d / "numa_node").write_text(text)
    return root


def test_numa_node_reads_sysfs(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, "0000:3b:00.0", "1\n")
    assert memory.numa_node("0000:3b:00.0", root) == 1
    assert memory.numa_node("0000:3c:00.0", root) is None
    other = _sysfs(tmp_path / "b", "0000:3b:00.0", "-1\n")
    assert memory.numa_node("0000:3b:00.0", other) is None


def test_preferring_node_sets_then_restores_the_thread_policy() -> None:
    policy = FakePolicy(saved=(2, 0b101))
    with memory.preferring_node(3, policy) as bound:
        assert bound and policy.calls == [(memory.MPOL_PREFERRED, 1 << 3)]
    assert policy.calls[-1] == (2, 0b101)
    default = FakePolicy(saved=(memory.MPOL_DEFAULT, 1))
    with memory.preferring_node(0, default):
        pass
    assert default.calls == [(memory.MPOL_PREFERRED, 1), (memory.MPOL_DEFAULT, 0)]


def test_preferring_node_leaves_the_policy_alone_without_a_node_or_permission() -> None:
    for node, policy in ((None, FakePolicy()), (0, FakePolicy(saved=None)), (5000, FakePolicy())):
        with memory.preferring_node(node, policy) as bound:
            assert not bound
        assert policy.calls == []
    refused = FakePolicy(allow=False)
    with memory.preferring_node(1, refused) as bound:
        assert not bound
    assert refused.calls == [(memory.MPOL_PREFERRED, 2)]


def test_host_near_allocates_under_the_gpu_s_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _sysfs(tmp_path, "0000:3b:00.0", "0\n")
    seen: list[object] = []

    class Drv:
        def device_pci_bus_id(self, dev: object) -> str:
            return "0000:3b:00.0"

        def host_alloc(self, nbytes: int) -> int:
            seen.append(("alloc", nbytes, memory._Syscalls().get()))  # pyright: ignore[reportPrivateUsage]
            return 4096

        def host_free(self, ptr: int) -> None:
            seen.append(("free", ptr))

    monkeypatch.setattr(memory, "drv", Drv())
    stack = ExitStack()
    alloc = memory.host_near(stack, "dev", 1000, root)
    assert (alloc.ptr, alloc.nbytes, alloc.where) == (4096, 1000, "host")
    stack.close()
    assert seen[0][:2] == ("alloc", 1024) and seen[-1] == ("free", 4096)  # pyright: ignore[reportIndexIssue]
