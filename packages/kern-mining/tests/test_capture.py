from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kern_mining.analyze import analyze_dir
from kern_mining.capture import SOURCE, build_library, capture_env, find_toolchain, run_capture
from kern_mining.dump import load_dump
from kern_mining.errors import CaptureError, ToolchainNotFoundError

HELPERS = Path(__file__).parent / "helpers"
KERNEL = r"""
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""


def test_the_source_ships_inside_the_package() -> None:
    text = SOURCE.read_text()
    assert "InitializeInjection" in text
    assert "CUPTI_CBID_RESOURCE_MODULE_LOADED" in text


def test_no_toolchain_is_a_typed_error_naming_what_is_missing(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    with pytest.raises(
        ToolchainNotFoundError, match=r"no cuda.h, cupti.h, libcupti.so, a C compiler found under"
    ):
        find_toolchain(env, roots=[tmp_path])


def test_the_toolchain_is_found_in_a_cuda_tree(tmp_path: Path) -> None:
    root = tmp_path / "cuda"
    (root / "targets/x86_64-linux/include").mkdir(parents=True)
    (root / "extras/CUPTI/include").mkdir(parents=True)
    (root / "lib64").mkdir()
    (root / "targets/x86_64-linux/include/cuda.h").write_text("")
    (root / "extras/CUPTI/include/cupti.h").write_text("")
    (root / "lib64/libcupti.so.13").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cc = bin_dir / "mycc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    tc = find_toolchain({"PATH": str(bin_dir), "CC": "mycc"}, roots=[root])
    assert tc.compiler == cc
    assert tc.include_dirs == (root / "targets/x86_64-linux/include", root / "extras/CUPTI/include")
    assert tc.cupti_library == root / "lib64/libcupti.so.13"


def test_capture_env_points_the_driver_at_the_library(tmp_path: Path) -> None:
    env = capture_env(tmp_path / "out", tmp_path / "lib.so", host_pointees=True, base={"A": "1"})
    assert env == {
        "A": "1",
        "CUDA_INJECTION64_PATH": str((tmp_path / "lib.so").resolve()),
        "KERN_CAPTURE_DIR": str((tmp_path / "out").resolve()),
        "KERN_CAPTURE_HOST_POINTEES": "1",
    }


def test_run_capture_passes_the_environment_and_the_exit_status(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    script = (
        "import json, os, sys; "
        f"json.dump({{k: os.environ.get(k) for k in ('CUDA_INJECTION64_PATH', 'KERN_CAPTURE_DIR')}}, open({str(seen)!r}, 'w')); "
        "sys.exit(3)"
    )
    result = run_capture(
        [sys.executable, "-c", script], tmp_path / "out", library=tmp_path / "fake.so"
    )
    assert result.returncode == 3
    assert result.process_dirs == ()
    assert json.loads(seen.read_text()) == {
        "CUDA_INJECTION64_PATH": str((tmp_path / "fake.so").resolve()),
        "KERN_CAPTURE_DIR": str((tmp_path / "out").resolve()),
    }


def test_an_empty_or_unstartable_command_is_a_capture_error(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no command"):
        run_capture([], tmp_path, library=tmp_path / "fake.so")
    with pytest.raises(CaptureError, match="cannot start"):
        run_capture([str(tmp_path / "no-such-program")], tmp_path, library=tmp_path / "fake.so")


def test_an_output_that_is_a_file_is_a_capture_error(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    with pytest.raises(CaptureError) as info:
        run_capture([sys.executable, "-c", "pass"], taken, library=tmp_path / "fake.so")
    assert str(info.value) == f"{taken}: cannot create the capture directory (File exists)"
    assert taken.read_text() == "x"


@pytest.mark.gpu
def test_the_record_writer_under_a_fake_driver(tmp_path: Path) -> None:
    toolchain = find_toolchain()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    cubin = tmp_path / "k.cubin"
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", str(source), "-o", str(cubin)], check=True)
    harness = tmp_path / "harness"
    includes = [f"-I{d}" for d in toolchain.include_dirs] + [f"-I{SOURCE.parent}"]
    build = [
        str(toolchain.compiler),
        "-std=gnu11",
        "-O1",
        "-pthread",
        *includes,
        str(HELPERS / "capture_harness.c"),
    ]
    lib = [str(toolchain.cupti_library), f"-Wl,-rpath,{toolchain.cupti_library.parent}", "-ldl"]
    subprocess.run([*build, "-o", str(harness), *lib], check=True)
    subprocess.run([str(harness), str(tmp_path / "out"), str(cubin)], check=True)
    dump = load_dump(tmp_path / "out")
    (module,) = dump.modules.values()
    assert module.id == 7 and "add_one" in module.functions
    assert module.sha256 == hashlib.sha256(cubin.read_bytes()).hexdigest()
    plain, ex, packed, unknown, host, junk = dump.launches
    assert (host.symbol, junk.symbol) == ("hostk", "hostk")
    assert (plain.module, plain.grid, plain.block, plain.cluster) == (
        7,
        (4, 1, 1),
        (256, 1, 1),
        None,
    )
    assert isinstance(plain.params, tuple) and plain.params[1].value == 1000
    pointer = plain.params[0].pointer
    assert pointer is not None and (pointer.memory_type, pointer.range_size) == ("device", 1 << 20)
    assert ex.cluster == (2, 1, 1) and ex.params == plain.params
    assert packed.params is None
    assert (unknown.symbol, unknown.params, unknown.shared_mem) == (
        'weird"name',
        "unknown-layout",
        16,
    )
    lines = [json.loads(x) for x in (dump.path / "launches.jsonl").read_text().splitlines()]
    assert lines[4]["params"][0]["pointee"] == "cd" * 64
    assert "pointee" not in lines[5]["params"][0] and "pointee" not in lines[0]["params"][0]
    assert len(lines) == 6  # the failed launch is not recorded


@pytest.mark.gpu
def test_the_injection_library_compiles_and_exports_its_entry_point(tmp_path: Path) -> None:
    library = build_library(tmp_path)
    assert library.is_file()
    assert build_library(tmp_path) == library  # cached
    nm = shutil.which("nm")
    if nm:
        symbols = subprocess.run(
            [nm, "-D", str(library)], capture_output=True, text=True, check=True
        ).stdout
        assert "InitializeInjection" in symbols


@pytest.mark.gpu
def test_end_to_end_capture_of_three_launch_paths(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    cubin = tmp_path / "k.cubin"
    subprocess.run([nvcc, "-cubin", "-arch=native", str(source), "-o", str(cubin)], check=True)
    library = build_library(tmp_path / "cache")
    result = run_capture(
        [sys.executable, str(HELPERS / "launch_child.py"), str(cubin), "add_one"],
        tmp_path / "out",
        library=library,
    )
    assert result.returncode == 0
    (pid,) = result.process_dirs
    modules = [json.loads(x) for x in (pid / "modules.jsonl").read_text().splitlines()]
    (mine,) = [m for m in modules if "add_one" in m["functions"]]
    blob = (pid / f"module_{mine['id']}.cubin").read_bytes()
    assert mine["sha256"] == hashlib.sha256(blob).hexdigest() and mine["bytes"] == len(blob)
    launches = [json.loads(x) for x in (pid / "launches.jsonl").read_text().splitlines()]
    ours = [r for r in launches if r["symbol"] == "add_one"]
    assert len(ours) == 3
    plain, ex, packed = ours
    assert plain["module"] == mine["id"] and ex["module"] == mine["id"]
    assert (plain["grid"], plain["block"], plain["cluster"]) == ([4, 1, 1], [256, 1, 1], None)
    (x, n) = plain["params"]
    assert (x["offset"], x["size"], n["offset"], n["size"]) == (0, 8, 8, 4)
    assert n["data"] == (1000).to_bytes(4, "little").hex() and n["pointer"] is None
    value = int.from_bytes(bytes.fromhex(x["data"]), "little")
    assert x["pointer"]["memory_type"] == "device"
    assert (
        x["pointer"]["range_start"]
        <= value
        < x["pointer"]["range_start"] + x["pointer"]["range_size"]
    )
    assert x["pointer"]["range_size"] >= 1 << 16
    assert (ex["grid"], ex["block"], ex["cluster"]) == ([4, 1, 1], [128, 1, 1], [2, 1, 1])
    assert ex["params"] == plain["params"]
    assert packed["params"] is None
    times = [r["t_ns"] for r in ours]
    assert times == sorted(times)
    dump = load_dump(pid)
    assert len(dump.launches) == len(launches)
    assert analyze_dir(pid).abi


@pytest.mark.gpu
def test_host_pointees_are_dumped_only_with_the_flag(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    cubin = tmp_path / "k.cubin"
    subprocess.run([nvcc, "-cubin", "-arch=native", str(source), "-o", str(cubin)], check=True)
    library = build_library(tmp_path / "cache")
    command = [sys.executable, str(HELPERS / "launch_child.py"), str(cubin), "add_one", "host"]
    records: dict[bool, dict[str, object]] = {}
    for flag in (False, True):
        result = run_capture(command, tmp_path / str(flag), library=library, host_pointees=flag)
        assert result.returncode == 0
        lines = (result.process_dirs[0] / "launches.jsonl").read_text().splitlines()
        (records[flag],) = [json.loads(x) for x in lines if json.loads(x)["symbol"] == "add_one"]
    off, on = records[False]["params"], records[True]["params"]
    assert isinstance(off, list) and isinstance(on, list)
    assert off[0]["pointer"]["memory_type"] == on[0]["pointer"]["memory_type"] == "host"
    assert "pointee" not in off[0]
    assert on[0]["pointee"] == "ab" * 64
    assert "pointee" not in on[1]
