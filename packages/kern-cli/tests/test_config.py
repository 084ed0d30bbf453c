"""kern.toml parsing: targets, run defaults, path resolution, typed errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kern_cli.config import KernTomlError, find_config, load_config

TOML = """
target = "b"
gpu = 1
capacity = 8192
[targets.a]
manifest = "m/a.json"
[targets.b]
manifest = "m/b.json"
kernels = "/abs/kernels"
weights = ["w1", "~/w2"]
tokenizer = "qwen2.5-72b-instruct"
[kernels]
sources = "src"
[run]
prompt = "hi"
steps = 7
chunk = 97
"""


def test_targets_paths_and_defaults(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(TOML)
    cfg = load_config(tmp_path / "kern.toml")
    b = cfg.target(None)
    assert b is not None and b.name == "b"
    assert b.manifest == tmp_path / "m/b.json"
    assert b.kernels == Path("/abs/kernels")
    assert b.weights == (tmp_path / "w1", Path.home() / "w2")
    assert cfg.target("a") is not None and cfg.target("a").kernels is None  # type: ignore[union-attr]
    assert (cfg.gpu, cfg.capacity, cfg.kernel_sources) == (1, 8192, tmp_path / "src")
    assert (cfg.run.prompt, cfg.run.steps, cfg.run.chunk) == ("hi", 7, 97)


def test_first_target_is_the_default(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text('[targets.x]\nmanifest = "x.json"\nweights = "w"\n')
    t = load_config(tmp_path / "kern.toml").target(None)
    assert t is not None and t.name == "x" and t.weights == (tmp_path / "w",)


def test_find_config_walks_up(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text("")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_config(deep) == tmp_path / "kern.toml"


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("colour = 1\n", "colour"),
        ("[run]\nsteps = 'many'\n", "steps must be a int"),
        ("[run]\nsteps = -1\n", "negative"),
        ("[targets.a]\nmanifest = 3\n", "manifest must be a str"),
        ("[targets.a]\nmodel = 'x'\n", "model"),
        ("[targets.a]\nweights = [1]\n", "weights"),
        ("target = 'zz'\n[targets.a]\n", "no target 'zz'"),
        ("gpu = true\n", "gpu must be a int"),
        ("[run\n", "kern.toml"),
        ("run = 3\n", "must be a table"),
    ],
)
def test_bad_config_is_one_typed_line(tmp_path: Path, text: str, word: str) -> None:
    (tmp_path / "kern.toml").write_text(text)
    with pytest.raises(KernTomlError, match=word) as info:
        load_config(tmp_path / "kern.toml")
    assert "\n" not in str(info.value).strip()


def test_unknown_target_lists_known(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(TOML)
    with pytest.raises(KernTomlError, match="declared: a, b"):
        load_config(tmp_path / "kern.toml").target("c")


def test_repository_kern_toml_names_existing_files() -> None:
    root = Path(__file__).resolve().parents[3]
    cfg = load_config(root / "kern.toml")
    t = cfg.target(None)
    assert t is not None and t.name == "qwen3-4b-fast"
    assert t.manifest is not None and t.manifest.is_file()
    # NOTE: the default target runs without nvcc: every cubin it pins ships in kernels/.
    pinned = json.loads(t.manifest.read_text())["modules"]
    shipped = {hashlib.sha256(p.read_bytes()).hexdigest() for p in t.kernels.glob("*.cubin")}
    assert {m["sha256"] for m in pinned.values()} <= shipped
    assert cfg.kernel_sources is not None and cfg.kernel_sources.is_dir()
    assert (cfg.run.steps, cfg.run.chunk) == (32, 2048)


@pytest.mark.parametrize("name", ["qwen3-4b", "qwen3-4b-gemv", "qwen3-4b-fast", "qwen3-4b-f32"])
def test_repository_kern_toml_targets_run_from_shipped_cubins(name: str) -> None:
    root = Path(__file__).resolve().parents[3]
    t = load_config(root / "kern.toml").target(name)
    assert t is not None and t.manifest is not None and t.manifest.is_file() and t.weights == ()
    pinned = json.loads(t.manifest.read_text())["modules"]
    assert {(root / "kernels" / m["source"]).is_file() for m in pinned.values()} == {True}, name


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"gpu = 1" + b"0" * 5000 + b"\n", "{path}: a number too long"),
        (b"\xff\xfe gpu = 1\n", "{path}: not UTF-8 text (byte 0)"),
        (b"".join(b"k%d = 1\n" % i for i in range(20)),
         "{path}: unknown key(s) k0, k1, k10, k11, k12, k13, k14, k15, k16, k17, k18, k19 (+8 more) "
         "(allowed: bench, capacity, gpu, kernels, run, serve, target, targets, test)"),
        (b"x" * 300 + b" = 1\n", "{path}: unknown key(s) " + "x" * 48 + "...(300 chars) "
         "(allowed: bench, capacity, gpu, kernels, run, serve, target, targets, test)"),
    ],
)
def test_our_own_line_for_what_python_would_say(tmp_path: Path, data: bytes, line: str) -> None:
    """No `sys.set_int_max_str_digits()` advice, no codec message, no unbounded list of names."""
    path = tmp_path / "kern.toml"
    path.write_bytes(data)
    with pytest.raises(KernTomlError) as info:
        load_config(path)
    assert str(info.value) == line.format(path=path)


def test_a_long_target_name_is_cut(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(TOML)
    with pytest.raises(KernTomlError) as info:
        load_config(tmp_path / "kern.toml").target("t" * 10_000)
    assert str(info.value) == f"{tmp_path / 'kern.toml'}: no target '{'t' * 48}...(10000 chars)' (declared: a, b)"


def test_a_number_too_long_is_one_line_from_the_console_script(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "kern.toml").write_bytes(b"gpu = 1" + b"0" * 5000 + b"\n")
    done = subprocess.run([sys.executable, "-m", "kern_cli.run", "--config", str(tmp_path / "kern.toml")],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kern-run: {tmp_path / 'kern.toml'}: a number too long\n")
