"""`kern kernels`: naming, reproducibility, caching and errors, with a fake compiler (CPU) and nvcc."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from kern_cli import main as kern_main
from kern_cli.config import load_config
from kern_mining.build import (
    CACHE_FILE,
    NVCC_FLAGS,
    CompileError,
    CompilerNotFoundError,
    KernelArchError,
    KernelOutputError,
    KernelSourceError,
    build_kernels,
)

REPO = Path(__file__).resolve().parents[3]
KERNELS_SRC = REPO / "tools" / "kernels-src"

# A stand-in for nvcc: `--version` prints a version, a build writes bytes derived from the flags,
# the source and the header it includes, and appends the source name to calls.log. A source that
# contains "#error" fails like a compile error.
FAKE_NVCC = """
import hashlib, pathlib, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("fake nvcc, release 13.0")
    sys.exit(0)
out = pathlib.Path(args[args.index("-o") + 1])
src = pathlib.Path(args[-1])
text = src.read_bytes()
if b"#error" in text:
    print(f"{src.name}(1): error: planted failure", file=sys.stderr)
    sys.exit(1)
header = pathlib.Path("common.cuh").read_bytes() if pathlib.Path("common.cuh").exists() else b""
flags = " ".join(args[: args.index("-o")]).encode()
out.write_bytes(b"CUBIN" + hashlib.sha256(flags + text + header).digest() * 4)
with open(pathlib.Path(__file__).parent / "calls.log", "a") as log:
    log.write(src.name + "\\n")
"""


@pytest.fixture
def fake_nvcc(tmp_path: Path) -> tuple[str, ...]:
    tool = tmp_path / "tool"
    tool.mkdir()
    script = tool / "fake_nvcc.py"
    script.write_text(FAKE_NVCC)
    return (sys.executable, str(script))


def _calls(compiler: tuple[str, ...]) -> list[str]:
    """The sources compiled so far, sorted (a build compiles its modules side by side)."""
    log = Path(compiler[1]).parent / "calls.log"
    return sorted(log.read_text().split()) if log.exists() else []


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "common.cuh").write_text("// shared\n")
    (d / "alpha.cu").write_text('#include "common.cuh"\nextern "C" __global__ void a() {}\n')
    (d / "beta.cu").write_text('extern "C" __global__ void b() {}\n')
    return d


def test_names_cubins_by_content_hash(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    built = build_kernels(src, out, compiler=fake_nvcc)
    assert list(built) == ["alpha", "beta"]
    for module, (path, sha) in built.items():
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha
        assert path == out / f"{module}-{sha[:12]}.cubin"
        assert data.startswith(b"CUBIN")
    assert built["alpha"][1] != built["beta"][1]


def test_same_source_gives_same_bytes(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    first = build_kernels(src, tmp_path / "one", compiler=fake_nvcc)
    second = build_kernels(src, tmp_path / "two", compiler=fake_nvcc)
    assert {m: sha for m, (_, sha) in first.items()} == {m: sha for m, (_, sha) in second.items()}
    assert _calls(fake_nvcc) == ["alpha.cu", "alpha.cu", "beta.cu", "beta.cu"]


def test_rebuild_is_skipped_when_nothing_changed(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    first = build_kernels(src, out, compiler=fake_nvcc)
    again = build_kernels(src, out, compiler=fake_nvcc)
    assert again == first
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu"]
    assert (out / CACHE_FILE).is_file()


def test_source_change_rebuilds_only_that_module(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    first = build_kernels(src, out, compiler=fake_nvcc)
    (src / "beta.cu").write_text('extern "C" __global__ void b2() {}\n')
    second = build_kernels(src, out, compiler=fake_nvcc)
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu", "beta.cu"]  # the first build, then beta alone
    assert second["alpha"] == first["alpha"]
    assert second["beta"][1] != first["beta"][1]
    assert first["beta"][0].is_file(), "older cubins stay for manifests that pin them"


def test_header_change_rebuilds_every_module(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    build_kernels(src, out, compiler=fake_nvcc)
    (src / "common.cuh").write_text("// shared, edited\n")
    build_kernels(src, out, compiler=fake_nvcc)
    assert _calls(fake_nvcc) == ["alpha.cu", "alpha.cu", "beta.cu", "beta.cu"]


def test_compiler_version_is_part_of_the_key(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    build_kernels(src, out, compiler=fake_nvcc)
    script = Path(fake_nvcc[1])
    script.write_text(script.read_text().replace("release 13.0", "release 13.1"))
    build_kernels(src, out, compiler=fake_nvcc)
    assert len(_calls(fake_nvcc)) == 4


def test_deleted_cubin_is_rebuilt(src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    first = build_kernels(src, out, compiler=fake_nvcc)
    first["alpha"][0].unlink()
    again = build_kernels(src, out, compiler=fake_nvcc)
    assert again == first
    assert first["alpha"][0].is_file()
    assert _calls(fake_nvcc) == ["alpha.cu", "alpha.cu", "beta.cu"]


def test_corrupt_cache_record_only_costs_a_rebuild(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    first = build_kernels(src, out, compiler=fake_nvcc)
    (out / CACHE_FILE).write_text("{not json")
    assert build_kernels(src, out, compiler=fake_nvcc) == first


def test_compile_error_writes_nothing(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    first = build_kernels(src, out, compiler=fake_nvcc)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (src / "alpha.cu").write_text("// edited\n")
    (src / "beta.cu").write_text("#error planted\n")
    with pytest.raises(CompileError, match=r"beta\.cu failed to compile .*planted failure"):
        build_kernels(src, out, compiler=fake_nvcc)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert first["alpha"][0].is_file()


def test_of_several_failures_the_first_module_is_reported(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    """Modules compile side by side; the error names the first failing one in module order, and
    only after every compile has finished (each ran: nothing is left running)."""
    (src / "alpha.cu").write_text("#error planted\n")
    (src / "beta.cu").write_text("#error planted\n")
    (src / "gamma.cu").write_text('extern "C" __global__ void g() {}\n')
    with pytest.raises(CompileError, match=r"^alpha\.cu failed to compile"):
        build_kernels(src, tmp_path / "out", compiler=fake_nvcc)
    assert _calls(fake_nvcc) == ["gamma.cu"]  # the failing ones exit before logging
    assert not (tmp_path / "out").exists()


def test_missing_compiler(src: Path, tmp_path: Path) -> None:
    with pytest.raises(CompilerNotFoundError, match="install the CUDA toolkit"):
        build_kernels(src, tmp_path / "out", compiler=(str(tmp_path / "no-such-nvcc"),))
    assert not (tmp_path / "out").exists()


def test_failing_compiler_version(src: Path, tmp_path: Path) -> None:
    with pytest.raises(CompilerNotFoundError, match="exited 3"):
        build_kernels(src, tmp_path / "out", compiler=(sys.executable, "-c", "raise SystemExit(3)"))


def test_missing_source_dir(tmp_path: Path, fake_nvcc: tuple[str, ...]) -> None:
    with pytest.raises(KernelSourceError, match="does not exist"):
        build_kernels(tmp_path / "nope", tmp_path / "out", compiler=fake_nvcc)


def test_empty_source_dir(tmp_path: Path, fake_nvcc: tuple[str, ...]) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(KernelSourceError, match=r"no \.cu modules"):
        build_kernels(tmp_path / "empty", tmp_path / "out", compiler=fake_nvcc)


def test_bad_module_name(src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]) -> None:
    (src / "bad-name.cu").write_text("\n")
    with pytest.raises(KernelSourceError, match="'bad-name'"):
        build_kernels(src, tmp_path / "out", compiler=fake_nvcc)


def test_cli_prints_module_and_sha(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    wrapper = tmp_path / "tool" / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec "{fake_nvcc[0]}" "{fake_nvcc[1]}" "$@"\n')
    wrapper.chmod(0o755)
    out = tmp_path / "out"
    code = kern_main.main(
        ["kernels", "--all", "--kernel-sources", str(src), "--out", str(out), "--nvcc", str(wrapper)]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    built = build_kernels(src, out, compiler=fake_nvcc)
    assert lines == [f"{m} {sha} {path}" for m, (path, sha) in built.items()]


def test_cli_bad_input_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = kern_main.main(
        ["kernels", "--all", "--kernel-sources", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_module_filter_builds_only_those(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    """An unselected module is never compiled, so one that fails cannot block the build."""
    (src / "broken.cu").write_text("#error planted\n")
    out = tmp_path / "out"
    built = build_kernels(src, out, compiler=fake_nvcc, modules=["beta"])
    assert list(built) == ["beta"] and _calls(fake_nvcc) == ["beta.cu"]
    assert sorted(p.name for p in out.glob("*.cubin")) == [built["beta"][0].name]
    again = build_kernels(src, out, compiler=fake_nvcc, modules={"alpha", "beta"})
    assert list(again) == ["alpha", "beta"] and again["beta"] == built["beta"]
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu"]  # beta was cached
    assert build_kernels(src, out, compiler=fake_nvcc, modules=[]) == {}
    with pytest.raises(CompileError, match=r"broken\.cu"):
        build_kernels(src, out, compiler=fake_nvcc)  # no filter: every module, as before


def test_a_module_without_source_is_named(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    with pytest.raises(KernelSourceError, match=r"no source for module\(s\) gamma in .* \(modules there: alpha, beta\)"):
        build_kernels(src, tmp_path / "out", compiler=fake_nvcc, modules=["alpha", "gamma"])
    assert _calls(fake_nvcc) == []


def _wrapper(tmp_path: Path, fake_nvcc: tuple[str, ...]) -> Path:
    wrapper = tmp_path / "tool" / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec "{fake_nvcc[0]}" "{fake_nvcc[1]}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def project(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kern.toml whose two targets pin alpha and beta (one each, in kernels/), with a broken,
    unpinned module beside them in the sources."""
    (src / "broken.cu").write_text("#error planted\n")
    (tmp_path / "m").mkdir()
    for name, module in (("a", "alpha"), ("b", "beta")):
        pins = {"modules": {module: {"source": f"{module}.cubin", "sha256": "0" * 64}}}
        (tmp_path / "m" / f"{name}.json").write_text(json.dumps({**_MINIMAL, **pins}))
    (tmp_path / "kern.toml").write_text(
        '[targets.a]\nmanifest = "m/a.json"\nkernels = "kernels"\n'
        '[targets.b]\nmanifest = "m/b.json"\nkernels = "kernels"\n[kernels]\nsources = "src"\n'
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


_MINIMAL = {"schema_version": 5, "model": "t", "vars": {}, "buffers": {}, "ops": {}, "programs": {}}


def test_cli_builds_the_modules_kern_toml_pins(
    project: Path, fake_nvcc: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert kern_main.main(["kernels", "--nvcc", str(_wrapper(project, fake_nvcc))]) == 0
    captured = capsys.readouterr()
    assert [ln.split()[0] for ln in captured.out.splitlines()] == ["alpha", "beta"]
    assert captured.err.splitlines() == [
        f"kern kernels: building the modules pinned by target(s) a, b: alpha, beta into {project / 'kernels'}"
    ]
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu"]  # broken.cu is pinned by nobody


def test_cli_named_modules_and_all(
    project: Path, fake_nvcc: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    nvcc = str(_wrapper(project, fake_nvcc))
    assert kern_main.main(["kernels", "beta", "--nvcc", nvcc]) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()] == ["beta"]
    assert kern_main.main(["kernels", "--all", "--nvcc", nvcc]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kern kernels: broken.cu failed to compile")
    assert kern_main.main(["kernels", "gamma", "--nvcc", nvcc]) == 2
    assert "no source for module(s) gamma" in capsys.readouterr().err
    assert kern_main.main(["kernels", "beta", "--all"]) == 2
    assert capsys.readouterr().err == "kern kernels: name modules or pass --all, not both\n"


@pytest.mark.parametrize(
    ("toml", "argv", "line"),
    [
        ('[targets.a]\nmanifest = "a.json"\n', [],
         "kern kernels: no kernel sources: pass --kernel-sources DIR or set [kernels] sources in kern.toml"),
        ("[kernels]\nsources = 'src'\n", [],
         "kern kernels: no kern.toml target pins a module: name the modules to build, pass --all, "
         "or --config a kern.toml with [targets]"),
        ('[targets.a]\nmanifest = "missing.json"\n[kernels]\nsources = "src"\n', [],
         "kern kernels: target a: manifest {tmp}/missing.json: No such file or directory"),
        ("", ["--config", "nope.toml"], "kern kernels: --config nope.toml: no such file"),
        ("", ["--from", "d", "m.json", "alpha"],
         "kern kernels: --from copies what MANIFEST pins: name no modules and no --all with it"),
    ],
)
def test_cli_bad_configuration_is_one_line(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    toml: str, argv: list[str], line: str,
) -> None:
    (tmp_path / "kern.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    assert kern_main.main(["kernels", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [line.format(tmp=tmp_path)]


def _dump_and_manifest(tmp_path: Path, data: bytes) -> tuple[Path, Path, str]:
    dump = tmp_path / "dump" / "pid7"
    dump.mkdir(parents=True)
    (dump / "module_1.cubin").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"modules": {"mined": {"source": "capture", "sha256": sha}}}))
    return dump, manifest, sha


def test_cli_from_extracts_pinned_cubins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump, manifest, sha = _dump_and_manifest(tmp_path, b"\x7fELF mined cubin")
    out = tmp_path / "kernels"
    assert kern_main.main(["kernels", "--from", str(dump), str(manifest), "--out", str(out)]) == 0
    target = out / f"mined-{sha[:12]}.cubin"
    assert target.read_bytes() == b"\x7fELF mined cubin"
    assert capsys.readouterr().out.splitlines() == [f"added {target}"]
    assert kern_main.main(["kernels", "--from", str(dump), str(manifest), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"present {target}"]


def test_cli_from_missing_module_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump, manifest, _sha = _dump_and_manifest(tmp_path, b"one")
    (dump / "module_1.cubin").write_bytes(b"other")
    out = tmp_path / "kernels"
    assert kern_main.main(["kernels", "--from", str(dump), str(manifest), "--out", str(out)]) == 2
    assert "has no cubin for mined" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.gpu
def test_nvcc_build_is_reproducible(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    assert nvcc is not None, "nvcc must be on PATH on GPU hosts"
    first = build_kernels(KERNELS_SRC, tmp_path / "one", compiler=(nvcc,))
    second = build_kernels(KERNELS_SRC, tmp_path / "two", compiler=(nvcc,))
    assert set(first) == {p.stem for p in KERNELS_SRC.glob("*.cu")}  # every module, the included ones too
    assert {"attention", "gemv", "qwen3_core", "sampling"} <= set(first)
    for module, (path, sha) in first.items():
        assert second[module][1] == sha
        assert path.read_bytes() == second[module][0].read_bytes()
        assert path.read_bytes()[:4] == b"\x7fELF"
    assert NVCC_FLAGS == ("-cubin", "-arch=sm_90", "-O3")


@pytest.mark.gpu
def test_kern_kernels_in_the_repo_builds_exactly_the_pinned_cubins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain `kern kernels` from the repo's kern.toml: the modules its targets' manifests pin, each
    with the sha256 the manifest pins, and nothing else."""
    nvcc = shutil.which("nvcc")
    assert nvcc is not None, "nvcc must be on PATH on GPU hosts"
    monkeypatch.chdir(REPO)
    assert kern_main.main(["kernels", "--out", str(tmp_path), "--nvcc", nvcc]) == 0
    built = {ln.split()[0]: ln.split()[1] for ln in capsys.readouterr().out.splitlines()}
    pinned: dict[str, str] = {}
    for target in load_config(REPO / "kern.toml").targets.values():
        assert target.manifest is not None
        for module, entry in json.loads(target.manifest.read_text())["modules"].items():
            pinned[module] = entry["sha256"]
    assert built == pinned
    assert sorted(p.stem.rsplit("-", 1)[0] for p in tmp_path.glob("*.cubin")) == sorted(pinned)


def _fake_cubin(flags: str, source: bytes, header: bytes) -> bytes:
    """What FAKE_NVCC writes for `source` built with `flags`."""
    return b"CUBIN" + hashlib.sha256(flags.encode() + source + header).digest() * 4


def test_a_kern_arch_line_builds_that_module_for_its_architecture(src: Path, tmp_path: Path,
                                                                   fake_nvcc: tuple[str, ...]) -> None:
    """A module's `// kern-arch: sm_90a` line swaps -arch for it alone; the others keep NVCC_FLAGS
    and their cache keys (not rebuilt); dropping the line rebuilds the module with NVCC_FLAGS."""
    out = tmp_path / "out"
    header = (src / "common.cuh").read_bytes()
    plain_source = (src / "beta.cu").read_bytes()
    plain = build_kernels(src, out, compiler=fake_nvcc)
    (src / "beta.cu").write_bytes(b"// kern-arch: sm_90a\n" + plain_source)
    hopper = build_kernels(src, out, compiler=fake_nvcc)
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu", "beta.cu"]
    assert hopper["alpha"] == plain["alpha"]
    assert plain["beta"][0].read_bytes() == _fake_cubin(" ".join(NVCC_FLAGS), plain_source, header)
    assert hopper["beta"][0].read_bytes() == _fake_cubin("-cubin -arch=sm_90a -O3", (src / "beta.cu").read_bytes(),
                                                         header)
    assert build_kernels(src, out, compiler=fake_nvcc) == hopper  # cached
    (src / "beta.cu").write_bytes(plain_source)
    assert build_kernels(src, out, compiler=fake_nvcc)["beta"][1] == plain["beta"][1]
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu", "beta.cu", "beta.cu"]


def test_a_bad_kern_arch_line_is_refused_before_anything_builds(src: Path, tmp_path: Path,
                                                                fake_nvcc: tuple[str, ...]) -> None:
    (src / "beta.cu").write_text('// kern-arch: sm_90a -G\nextern "C" __global__ void b() {}\n')
    with pytest.raises(KernelArchError, match=re.escape("beta.cu: '// kern-arch: sm_90a -G' names no architecture")):
        build_kernels(src, tmp_path / "out", compiler=fake_nvcc)
    assert not (tmp_path / "out").exists() and _calls(fake_nvcc) == []
    assert build_kernels(src, tmp_path / "out", compiler=fake_nvcc, modules=["alpha"])  # beta not selected


def test_kern_kernels_reports_a_bad_kern_arch_line_on_one_line(src: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (src / "alpha.cu").write_text("// kern-arch: sm_90a\n// kern-arch: sm_100a\n")
    out = tmp_path / "out"
    assert kern_main.main(["kernels", "--all", "--kernel-sources", str(src), "--out", str(out),
                           "--nvcc", sys.executable]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kern kernels: alpha.cu has 2 kern-arch lines: keep one"]
    assert not out.exists()


def test_a_change_to_an_included_source_rebuilds_the_module_that_includes_it(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...]
) -> None:
    """gamma.cu includes beta.cu for its device code: editing beta.cu rebuilds both, not alpha."""
    (src / "gamma.cu").write_text('#include "beta.cu"\nextern "C" __global__ void g() {}\n')
    out = tmp_path / "out"
    build_kernels(src, out, compiler=fake_nvcc)
    build_kernels(src, out, compiler=fake_nvcc)
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu", "gamma.cu"]  # the second build was all cached
    (src / "beta.cu").write_text('extern "C" __global__ void b2() {}\n')
    build_kernels(src, out, compiler=fake_nvcc)
    assert _calls(fake_nvcc) == ["alpha.cu", "beta.cu", "beta.cu", "gamma.cu", "gamma.cu"]  # then beta and gamma


@pytest.mark.parametrize("out", ["file", "file/sub"])
def test_an_output_directory_that_is_a_file_is_refused_before_compiling(
    src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...], out: str
) -> None:
    (tmp_path / "file").write_text("kept")
    where = "" if out == "file" else f" ({tmp_path / 'file'} is a file)"
    with pytest.raises(KernelOutputError, match=f"^kernels directory {re.escape(str(tmp_path / out))} is not a "
                                                f"directory{re.escape(where)}$"):
        build_kernels(src, tmp_path / out, compiler=fake_nvcc)
    assert _calls(fake_nvcc) == [] and (tmp_path / "file").read_text() == "kept"


def _kernels_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert kern_main.main(["kernels", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_kern_kernels_bad_out_and_nvcc_are_one_line_exit_2(
    project: Path, src: Path, tmp_path: Path, fake_nvcc: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    nvcc = str(_wrapper(project, fake_nvcc))
    (tmp_path / "file").write_text("kept")
    assert _kernels_cli(["--out", str(tmp_path / "file"), "--nvcc", nvcc], capsys) == (
        f"kern kernels: --out {tmp_path / 'file'}: exists and is not a directory")
    assert _kernels_cli(["--nvcc", str(tmp_path / "nonexistent")], capsys) == (
        f"kern kernels: --nvcc {tmp_path / 'nonexistent'}: no such program (or not executable)")
    assert _kernels_cli(["--all", "--kernel-sources", str(tmp_path / "file"), "--nvcc", nvcc], capsys) == (
        f"kern kernels: kernel source directory {tmp_path / 'file'} is not a directory")
    assert _calls(fake_nvcc) == []


def test_kern_kernels_says_when_nvcc_is_not_on_path(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(project / "no-bin"))
    assert _kernels_cli([], capsys) == "kern kernels: nvcc is not on PATH: install the CUDA toolkit or pass --nvcc PATH"


def test_a_target_kernels_directory_that_is_a_file_is_one_line(
    project: Path, fake_nvcc: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = project / "kernels"
    shutil.rmtree(kernels, ignore_errors=True)
    kernels.write_text("not a directory")
    assert _kernels_cli(["--nvcc", str(_wrapper(project, fake_nvcc))], capsys) == (
        f"kern kernels: kernels directory {kernels}: exists and is not a directory")


@pytest.mark.parametrize(
    ("data", "why"),
    [(b"\xff{}", "not UTF-8 text, byte 0"), (b'{"modules": 1' + b"0" * 5000 + b"}", "a number too long")],
)
def test_cli_from_a_manifest_python_cannot_read_is_our_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, why: str
) -> None:
    dump, _, _ = _dump_and_manifest(tmp_path, b"CUBIN")
    manifest = tmp_path / "bad.json"
    manifest.write_bytes(data)
    assert _kernels_cli(["--from", str(dump), str(manifest), "--out", str(tmp_path / "k")], capsys) == (
        f"kern kernels: {manifest}: cannot read it as JSON ({why})")
