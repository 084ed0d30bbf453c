"""kern serve on the host, without a model: flags checked before anything loads (one line, exit 2).
The request checks and the text a client sees are kern_serve's (packages/kern-serve/tests); the
server itself runs as a process in tools/tests/test_serve_interp.py."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

import kern_serve
from kern_cli import serve
from kern_cli.main import main as kern_main
from kern_runtime.loading import available_ram, size_text

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "examples" / "qwen3-tiny.json")


def _line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("argv", "line"), [
    (["--port", "70000"], "kern serve: --port must be in 0..65535, got 70000"),
    (["--rows", "0"], "kern serve: --rows must be at least 1, got 0"),
    (["--grow", "-1"], "kern serve: --grow must be at least 0, got -1"),
    (["--chunk-graphs", "-1"], "kern serve: --chunk-graphs must be at least 0, got -1"),
    (["--api-key", ""], "kern serve: the API key is empty: pass --api-key KEY or unset KERN_API_KEY"),
    (["--backend", "nomodule"], "kern serve: --backend 'nomodule': write MODULE:ATTRIBUTE (e.g. "
                                "kern_runtime.serving:open_engine)"),
    (["--backend", "kern_cli.nothing:engine"], "kern serve: --backend 'kern_cli.nothing:engine': cannot import "
                                               "kern_cli.nothing (No module named 'kern_cli.nothing')"),
    (["--backend", "kern_cli.serve:nothing"], "kern serve: --backend 'kern_cli.serve:nothing': kern_cli.serve has "
                                              "no callable nothing"),
    (["--tokenizer", "kern_cli.serve:nothing"], "kern serve: --tokenizer 'kern_cli.serve:nothing': kern_cli.serve has "
                                                "no callable nothing"),
])
def test_bad_flags_are_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--manifest", TINY, "--port", "0", *argv]) == 2
    assert _line(capsys) == line


def test_a_missing_manifest_and_a_taken_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--manifest", str(tmp_path / "no.json")]) == 2
    assert _line(capsys) == f"kern serve: --manifest {tmp_path / 'no.json'}: no such file"
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
        argv = ["serve", "--manifest", TINY, "--port", str(port), "--tokenizer", "kern_interp.serve:tokenizer"]
        assert kern_main(argv) == 2
        assert _line(capsys).startswith(f"kern serve: cannot listen on 127.0.0.1:{port}: ")


def test_the_backend_default_is_kern_serves() -> None:
    """The flag's default is the factory kern_serve prepares a GPU for."""
    assert serve.DEFAULT_BACKEND == kern_serve.DEFAULT_BACKEND


def test_the_api_key_comes_from_the_environment() -> None:
    args = serve.build_parser().parse_args(["--manifest", TINY])
    assert serve.resolve(args, {"KERN_API_KEY": "k"}).api_key == "k"
    assert serve.resolve(args, {}).api_key is None
    args = serve.build_parser().parse_args(["--manifest", TINY, "--api-key", "flag"])
    assert serve.resolve(args, {"KERN_API_KEY": "env"}).api_key == "flag"
    assert serve.resolve(args, {}).host == "127.0.0.1"
    assert serve.resolve(args, {}).chunk_graphs == 32
    args = serve.build_parser().parse_args(["--manifest", TINY, "--chunk-graphs", "0"])
    assert serve.resolve(args, {}).chunk_graphs == 0
    assert serve.resolve(args, {}).first_token == "step"
    args = serve.build_parser().parse_args(["--manifest", TINY, "--first-token", "head"])
    assert serve.resolve(args, {}).first_token == "head"


def test_bench_serve_is_routed_and_checks_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["bench", "serve", "--manifest", TINY, "--clients", "0"]) == 2
    assert _line(capsys) == "kern bench serve: --clients needs positive integers, got '0'"
    assert kern_main(["bench", "serve", "--manifest", TINY, "--rounds", "0"]) == 2
    assert _line(capsys) == "kern bench serve: --rounds must be at least 1, got 0"


def _toml(tmp: Path, serve_table: str) -> Path:
    (tmp / "a.json").write_text("{}")
    (tmp / "b.json").write_text("{}")
    path = tmp / "kern.toml"
    path.write_text('target = "a"\n[targets.a]\nmanifest = "a.json"\n[targets.b]\nmanifest = "b.json"\n' + serve_table)
    return path


def test_serve_takes_kern_toml_serve_target_unless_one_is_named(tmp_path: Path) -> None:
    cfg = str(_toml(tmp_path, '[serve]\ntarget = "b"\n'))
    assert serve.resolve(serve.build_parser().parse_args(["--config", cfg])).load.manifest == tmp_path / "b.json"
    named = serve.build_parser().parse_args(["--config", cfg, "a"])
    assert serve.resolve(named).load.manifest == tmp_path / "a.json"
    flag = serve.build_parser().parse_args(["--config", cfg, "--manifest", TINY])
    assert serve.resolve(flag).load.manifest == Path(TINY)
    plain = str(_toml(tmp_path, ""))
    assert serve.resolve(serve.build_parser().parse_args(["--config", plain])).load.manifest == tmp_path / "a.json"


@pytest.mark.parametrize(("table", "word"), [
    ('[serve]\ntarget = "nope"\n', "no target 'nope' (declared: a, b)"),
    ("[serve]\ntarget = 3\n", "[serve]"),
    ('[serve]\nrows = 4\n', "rows"),
])
def test_a_bad_serve_table_is_one_line(tmp_path: Path, table: str, word: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--config", str(_toml(tmp_path, table))]) == 2
    line = _line(capsys)
    assert line.startswith("kern serve: ") and word in line


# ---- startup checks: backend, tokenizer, sizes ----------------------------------------------------

CPU_TOKENIZER = ["--tokenizer", "kern_interp.serve:tokenizer"]


@pytest.mark.parametrize(("argv", "line"), [
    (["--backend", "os:getcwd"],
     "kern serve: --backend 'os:getcwd': getcwd() cannot be called with one kern_runtime.serving.EngineSpec"),
    (["--backend", "kern_cli." + "x" * 200 + ":engine"],
     "kern serve: --backend 'kern_cli.xxxxxxxx...xxxxxxxxxxx:engine': cannot import kern_cli.xxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "... (No module named 'kern_cli.xxxxxxxxxxx...)"),
    ([*CPU_TOKENIZER[:1], "os:getcwd"],
     "kern serve: --tokenizer 'os:getcwd' gave a str, which has no encode(text) and decode(ids)"),
    ([*CPU_TOKENIZER[:1], "os:getenv"],
     "kern serve: --tokenizer 'os:getenv': getenv(key, default=None) cannot be called with no argument"),
    ([], "kern serve: --tokenizer 'qwen2.5-72b-instruct' gives ids up to 151850; the model ('qwen3-tiny.json') takes "
         "token ids 0..4095: pass this model's tokenizer"),
    ([*CPU_TOKENIZER, "--rows", "1000000000"],
     "kern serve: --rows 1000000000: a pool of 65536 tokens has 4096 pages of 16 tokens and a running request holds "
     "at least one: pass --rows 4096 or less, or a larger --capacity"),
    ([*CPU_TOKENIZER, "--capacity", "100", "--rows", "8"],
     "kern serve: --rows 8: a pool of 100 tokens has 7 pages of 16 tokens and a running request holds at least one: "
     "pass --rows 7 or less, or a larger --capacity"),
    ([*CPU_TOKENIZER, "--capacity", "100000000000000000000"],
     "kern serve: --capacity 100000000000000000000: the capacity cannot hold the pool: a budget of "
     "3051757812500000 chunks of 67108864 bytes is past the 1048576 chunks a pool holds: ask for fewer tokens"),
])
def test_bad_backends_tokenizers_and_sizes_are_one_line(argv: list[str], line: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before the GPU is looked for (this machine has none) and before the port is bound."""
    assert kern_main(["serve", "--manifest", TINY, "--port", "0", *argv]) == 2
    assert _line(capsys) == line


def test_host_bytes_past_the_ram_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--manifest", TINY, *CPU_TOKENIZER, "--host-bytes", "1000000000000000"]) == 2
    assert re.fullmatch(r"kern serve: backend 'kern_runtime\.serving:open_engine' needs 909\.5 TiB of RAM \(the host "
                        r"tier 909\.5 TiB\); this machine has [\d.]+ [KMGT]iB available: pass a smaller --capacity or "
                        r"--host-bytes", _line(capsys))


def test_bench_serve_checks_the_same_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["bench", "serve", "--manifest", TINY, "--capacity", "100000000000000000000"]) == 2
    assert _line(capsys).startswith("kern bench serve: --capacity 100000000000000000000: the capacity cannot hold the "
                                    "pool: a budget of 3051757812500000 chunks")
    assert kern_main(["bench", "serve", "--manifest", TINY, "--rows", "1000000000"]) == 2
    assert _line(capsys).startswith("kern bench serve: --rows 1000000000: a pool of 65536 tokens has 4096 pages")


def test_size_text_and_the_ram_available(tmp_path: Path) -> None:
    assert [size_text(n) for n in (0, 1023, 1024, 3 << 29, 10**15, 1 << 80)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "1.5 GiB", "909.5 TiB", "over 1024 EiB"]
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n")
    assert available_ram(info) == 8000000 * 1024
    assert available_ram(tmp_path / "none") > 0


def test_a_host_tier_below_one_page_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A tier that holds no KV page would silently be none."""
    assert kern_main(["serve", "--manifest", TINY, *CPU_TOKENIZER, "--host-bytes", "32767"]) == 2
    assert _line(capsys) == ("kern serve: --host-bytes 32767 holds no KV page of 32768 bytes: pass 0 (no host tier) "
                             "or at least 32768")
