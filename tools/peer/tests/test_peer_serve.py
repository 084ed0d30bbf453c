"""The serving peer on the host (no torch): its workload, its level measurement over a fake
continuous-batching manager that streams tokens from its own thread, and every bad flag of
`kern-peer-serve` as one line and exit 2."""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kern_peer.serve_cli as cli
from kern_peer.serve import Workload, measure, percentile, prompts


@dataclass
class _Out:
    request_id: str
    generated_tokens: list[int]
    error: str | None = None
    done: bool = False

    def is_finished(self) -> bool:
        return self.done


@dataclass
class FakeManager:
    """Streams `max_new_tokens` tokens per request, one every `tick` seconds, from its own thread."""

    tick: float = 0.001
    fail: bool = False
    started: bool = False
    stopped: bool = False
    seen: list[list[int]] = field(default_factory=list[list[int]])
    _q: queue.Queue[Any] = field(default_factory=queue.Queue)
    _n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.started = True

    def stop(self, block: bool = True) -> None:
        self.stopped = True

    def add_request(self, input_ids: list[int], max_new_tokens: int, streaming: bool) -> str:
        assert streaming and self.started
        with self._lock:
            rid = f"r{self._n}"
            self._n += 1
            self.seen.append(list(input_ids))
        threading.Thread(target=self._stream, args=(rid, max_new_tokens), daemon=True).start()
        return rid

    def _stream(self, rid: str, n: int) -> None:
        for i in range(1, n + 1):
            time.sleep(self.tick)
            self._q.put(_Out(rid, list(range(i)), "boom" if self.fail else None, i == n or self.fail))
            if self.fail:
                return

    def get_result(self, timeout: float | None = None) -> _Out | None:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None


def test_prompts_share_the_system_prompt_and_draw_their_own_questions() -> None:
    w = Workload((1,), system=16, question=4, vocab=50, seed=3)
    a, b = prompts(w, 2, salt=0), prompts(w, 2, salt=1)
    assert all(len(p) == 20 and p[:16] == a[0][:16] for p in a + b)
    assert len({tuple(p[16:]) for p in a + b}) == 4 and all(0 <= t < 50 for p in a for t in p)
    assert prompts(w, 2, salt=0) == a


def test_percentile() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and math.isnan(percentile([], 99))


def test_each_level_counts_its_requests_tokens_and_times() -> None:
    w = Workload((1, 3), system=8, question=2, max_tokens=5, rounds=2, vocab=100)
    fake = FakeManager()
    levels = measure(fake, w)
    assert fake.started and fake.stopped
    assert [(lv.clients, lv.requests, lv.output_tokens) for lv in levels] == [(1, 2, 10), (3, 6, 30)]
    assert len(fake.seen) == 3 + 2 + 6  # the warm-up wave of the largest level, then the levels
    for lv in levels:
        assert lv.output_tok_s > 0 and 0 < lv.ttft_p50_ms <= lv.ttft_p99_ms and lv.tpot_p50_ms > 0
        assert lv.output_tok_s == pytest.approx(lv.output_tokens / lv.wall_s)


def test_a_failed_request_fails_the_level() -> None:
    with pytest.raises(RuntimeError, match="requests failed at 1 clients: boom"):
        measure(FakeManager(fail=True), Workload((1,), system=4, question=1, max_tokens=3, rounds=1))


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--clients", "1,,2"], "--clients has an empty item"),
        (["--clients", "0"], "--clients needs positive integers"),
        (["--system", "0"], "--system must be at least 1"),
        (["--max-tokens", "-3"], "--max-tokens must be at least 1"),
        (["--gpu", "-1"], "--gpu must not be negative"),
        (["--max-tokens", "100000"], "is 100544 positions; the model holds"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           flags: list[str], line: str) -> None:
    code = cli.main(["--weights", str(ckpt), "--json", str(tmp_path / "o.json"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("kern-peer-serve: ") and line in err[0]


def test_bad_paths_are_one_line_and_exit_2(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--weights", str(tmp_path / "none"), "--json", str(tmp_path / "o.json")]) == 2
    assert cli.main(["--weights", str(ckpt), "--json", str(tmp_path / "no" / "o.json")]) == 2
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert cli.main(["--weights", str(ckpt), "--json", str(tmp_path / "o.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(x.startswith("kern-peer-serve: ") for x in lines)
