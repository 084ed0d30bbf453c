"""State arena sizing (pure) and alignment."""

from __future__ import annotations

from kern_manifest import State
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
