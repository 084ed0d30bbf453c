"""`kern serve` on the CPU backend at startup: the README's command served as written (kern.toml's
qwen3-tiny-batch target, a real process answering the openai client), and every mismatch between
the backend and the manifest, weights or sizes one `kern serve:` line with exit 2, before anything
is allocated: weights that are not a safetensors file, a checkpoint of another model (the
interpreter's default tiny checkpoint under the 4B manifest too), KV or host tier bytes past the
RAM."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import openai
import pytest
from helpers.serve_proc import CPU_FLAGS, launch

from kern_cli.main import main as kern_main
from kern_interp.serve import engine
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint
from kern_runtime.serving import EngineSpec

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "qwen3-tiny-batch.json"
CPU = ["--backend", "kern_interp.serve:engine"]


def _file(header: dict[str, object], data: int) -> bytes:
    """A safetensors file of `header` and `data` zero bytes."""
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(data)


def _line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_readme_command_serves_the_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`uv run kern serve qwen3-tiny-batch --backend kern_interp.serve:engine` from the repository:
    kern.toml's CPU target (its manifest, tokenizer and the default capacity), the seeded random
    checkpoint written once; chat and completions answer."""
    readme = (ROOT / "README.md").read_text()
    assert "`uv run kern serve qwen3-tiny-batch --backend kern_interp.serve:engine`" in readme
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path))
    srv = launch(["qwen3-tiny-batch", *CPU, "--port", "0"], 180)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        chat = client.chat.completions.create(model="qwen3-tiny-batch", max_tokens=6,
                                              messages=[{"role": "user", "content": "Hello there"}])
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage is not None
        text = client.completions.create(model="qwen3-tiny-batch", prompt="The capital of France is", max_tokens=6)
        assert text.usage is not None and text.usage.prompt_tokens == len("The capital of France is")
    finally:
        assert srv.stop() == 0
    assert "reach 4096 tokens" in srv.stderr and "Traceback" not in srv.stderr, srv.stderr


@pytest.mark.parametrize(("content", "line"), [
    (b"hello", "not a safetensors file (5 bytes, no header)"),
    (b"1234567", "not a safetensors file (7 bytes, no header)"),
    (b"a text file, not weights\n" * 40, "not a safetensors file (1000 bytes, no header)"),
    (b"\x05\x00\x00\x00\x00\x00\x00\x00[1,2]", "not a safetensors file (its header is not a JSON object)"),
    (b"\x04\x00\x00\x00\x00\x00\x00\x00{]]}", "not a safetensors file (its header is not JSON)"),
    (_file({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, 4),
     "tensor 'w' bytes [0, 8) do not fit its shape or the file"),
    (_file({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}}, 8),
     "tensor 'w' bytes [0, 6) do not fit its shape or the file"),
    (_file({"w": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}, 8),
     "tensor 'w' is I8; the CPU backend reads BF16, F8_E4M3 and F32 tensors"),
    (_file({"w": {"dtype": "BF16", "shape": "x"}}, 0), "tensor 'w' has a bad header entry"),
])
def test_weights_that_are_not_a_checkpoint_are_one_line(tmp_path: Path, content: bytes, line: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(content)
    assert kern_main(["serve", *CPU_FLAGS, "--port", "0", "--weights", str(path)]) == 2
    got = _line(capsys)
    assert got.startswith("kern serve: weights ") and got.endswith(f"/w.safetensors: {line}"), got
    assert len(got) < 100 + len(line)  # the path cut to its last 60 characters


def test_a_checkpoint_of_another_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other, _ = random_checkpoint({**QWEN3_TINY_CONFIG, "hidden_size": 128}, seed=1, name="other", root=tmp_path)
    assert kern_main(["serve", *CPU_FLAGS, "--port", "0", "--weights", str(other)]) == 2
    assert _line(capsys) == ("kern serve: the weights do not fit qwen3-tiny-batch.json: buffer 'embed' holds 1048576 "
                             "values, the checkpoint's model.embed_tokens.weight 524288 (these weights are another "
                             "model's: pass this manifest's checkpoint)")


def test_the_default_tiny_checkpoint_under_the_4b_manifest_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's old line: no target, so kern.toml's [serve] target (the 4B manifest) with the
    interpreter's default checkpoint."""
    assert kern_main(["serve", *CPU, "--port", "0"]) == 2
    assert _line(capsys) == (
        "kern serve: the weights do not fit qwen3-4b-batch.json: buffer 'embed' holds 388956160 values, the "
        "checkpoint's model.embed_tokens.weight 1048576 (the CPU backend's default checkpoint is the tiny Qwen3's: "
        "pass --weights for this manifest, or serve the tiny model (kern serve qwen3-tiny-batch --backend "
        "kern_interp.serve:engine))")


@pytest.mark.parametrize(("flags", "what"), [
    (["--capacity", "100000000000000000000"], r"over 1024 EiB of RAM \(the KV pool over 1024 EiB, "),
    (["--host-bytes", "1000000000000000"], r"1\.8 PiB of RAM \(the KV pool 16\.0 MiB, the host tier 1\.8 PiB, "),
])
def test_sizes_past_the_ram_are_one_line(flags: list[str], what: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", *CPU_FLAGS, "--port", "0", *flags]) == 2
    assert re.fullmatch(r"kern serve: backend 'kern_interp\.serve:engine' needs " + what + r"the buffers 49\.7 MiB, "
                        r"the checkpoint 11\.5 MiB\); this machine has [\d.]+ [KMGT]iB available: pass a smaller "
                        r"--capacity or --host-bytes", _line(capsys))


def test_the_ram_the_cpu_backend_says_is_what_it_allocates() -> None:
    """`engine.ram(spec)`'s KV pool and host tier are the interpreter's arrays, byte for byte."""
    spec = EngineSpec(TINY, ROOT / "kernels", (), 0, 1000, 8, 3 * 32768 + 5, 64)
    asks = engine.ram(spec)
    eng = engine(spec)
    try:
        backend = eng.backend
        assert asks["the KV pool"] == backend.machine.kv.nbytes == 1024 * 2048 * 2  # type: ignore[attr-defined]
        assert asks["the host tier"] == backend.host_kv.nbytes == 3 * 65536  # type: ignore[attr-defined]
        assert asks["the buffers"] == sum(a.nbytes for a in backend.machine.mem.values())  # type: ignore[attr-defined]
    finally:
        eng.close()


def test_the_tiny_fp8_manifest_serves_on_its_own_fp8_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without weights the CPU backend takes the checkpoint the provider writes for the manifest:
    the FP8 one for `examples/qwen3-tiny-fp8.json`, whose e4m3 buffers hold its decoded values."""
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path))
    spec = EngineSpec(ROOT / "examples" / "qwen3-tiny-fp8.json", ROOT / "kernels", (), 0, 256, 2, 0, 64)
    eng = engine(spec)
    try:
        mem = eng.backend.machine.mem  # type: ignore[attr-defined]
        assert mem["l0.qkv.scale"].size == 8 * 2 and bool((mem["l0.qkv.scale"] > 0).all())
        assert len(list((tmp_path / "random").glob("qwen3-tiny-qwen-fp8-*"))) == 1
        seq = eng.sequence()
        assert len(eng.turn(seq, [1, 2, 3, 4, 5], 4).tokens) == 4
    finally:
        eng.close()
