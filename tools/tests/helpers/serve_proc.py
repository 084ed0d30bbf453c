"""A real `kern serve` process on the CPU backend (the tiny Qwen3 with its batched step,
examples/qwen3-tiny-batch.json, through the interpreter): started on a free port, its stderr kept,
stopped with SIGINT; and the reference answers of the same engine in this process (one request at
a time: greedy, or sampled with a seed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kern_qwen3 import STOP_TEXTS, render
from kern_runtime import Sampled, Sampling
from kern_runtime.serving import EngineSpec

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "examples" / "qwen3-tiny-batch.json"
CAPACITY = 4096
MODEL = "qwen3-tiny-batch"
CPU_FLAGS = ("--backend", "kern_interp.serve:engine", "--tokenizer", "kern_interp.serve:tokenizer",
             "--manifest", str(MANIFEST), "--capacity", str(CAPACITY))


@dataclass
class Server:
    """A running `kern serve`: its process, base URL and stderr lines."""

    proc: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list[str])
    reader: threading.Thread | None = None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.reader is not None:
            self.reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)


def start(weights: Path, *flags: str, timeout: float = 120.0) -> Server:
    """`kern serve` with the CPU flags, `--weights weights`, port 0 and `flags`; returns once it
    listens."""
    return launch([*CPU_FLAGS, "--weights", str(weights), "--port", "0", *flags], timeout)


def launch(flags: Sequence[str], timeout: float) -> Server:
    """`kern serve FLAGS` from the repository root; returns once it listens (its stderr says where)."""
    cmd = [sys.executable, "-m", "kern_cli.main", "serve", *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("KERN_API_KEY", None)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    srv = Server(proc)
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            srv.lines.append(line.rstrip("\n"))
            if (m := re.search(r"listening on (http://\S+)", line)) is not None:
                srv.url = m.group(1)
                ready.set()
        ready.set()

    srv.reader = threading.Thread(target=read, daemon=True)
    srv.reader.start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.2):
        if time.monotonic() > deadline:
            srv.stop()
            raise AssertionError(f"kern serve did not start: {srv.stderr}")
    if not srv.url:
        raise AssertionError(f"kern serve exited {proc.wait()}: {srv.stderr}")
    return srv


class Reference:
    """The same engine in this process: each prompt alone until a stop id or max_tokens, greedy
    (`tokens`, `text`, ...) or with a `Sampling` (`sampled`)."""

    def __init__(self, weights: Path) -> None:
        from kern_interp.serve import ByteTokenizer
        from kern_interp.serve import engine as cpu_engine

        spec = EngineSpec(MANIFEST, ROOT / "kernels", (weights,), 0, CAPACITY, 1, 0, 512)
        self.engine = cpu_engine(spec)
        self.tok = ByteTokenizer()
        self.stops = frozenset(self.tok.encode(s)[0] for s in STOP_TEXTS)
        self.cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def tokens(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in self.cache:
            seq = self.engine.sequence()
            self.cache[key] = self.engine.turn(seq, list(prompt), max_tokens, stop=self.stops).tokens
            self.engine.release(seq)
        return self.cache[key]

    def sampled(self, prompt: Sequence[int], max_tokens: int, sampling: Sampling) -> list[Sampled]:
        seq = self.engine.sequence()
        self.engine.prefill(seq, list(prompt), max_tokens)
        out: list[Sampled] = []
        while len(out) < max_tokens and not (out and out[-1].token in self.stops):
            out += self.engine.decode([seq], [sampling])
        self.engine.finish(seq)
        self.engine.release(seq)
        return out

    def shown(self, ids: Sequence[int]) -> str:
        return self.tok.decode([t for t in ids if t not in self.stops])

    def text(self, prompt: Sequence[int], max_tokens: int) -> str:
        return self.shown(self.tokens(prompt, max_tokens))

    def completion(self, prompt: str, max_tokens: int) -> str:
        return self.text(self.tok.encode(prompt), max_tokens)

    def chat(self, messages: Sequence[dict[str, str]], max_tokens: int) -> str:
        return self.text(self.tok.encode(render(messages)), max_tokens)

    def close(self) -> None:
        self.engine.close()

