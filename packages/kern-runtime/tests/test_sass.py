"""kern_runtime.sass: the multicast scan on checked-in SASS of a multicast kernel and a clean one
(fixtures/sass; never launched), and cuobjdump's lookup."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kern_runtime import KernelArtifactError, MissingToolError, sass

FIXTURES = Path(__file__).parent / "fixtures" / "sass"


def _functions(name: str) -> dict[str, list[str]]:
    return sass.sass_functions((FIXTURES / f"{name}.sass").read_text())


def test_fixtures_parse_into_their_functions() -> None:
    mc, clean = _functions("multicast"), _functions("clean")
    assert sorted(mc) == ["mc_sum"] and sorted(clean) == ["peer_sum"]
    assert any("LDGMC" in line for line in mc["mc_sum"])
    assert len(clean["peer_sum"]) > 20 and all("LDGMC" not in line for line in clean["peer_sum"])


def test_the_multicast_kernel_is_refused_with_its_instruction() -> None:
    with pytest.raises(KernelArtifactError, match=r"'mc_sum' is handed a peer buffer .* first: LDGMC\.E\.ADD\.F32"):
        sass.scan_kernel(_functions("multicast"), "mc", "mc_sum")


def test_the_clean_kernel_passes() -> None:
    sass.scan_kernel(_functions("clean"), "peer", "peer_sum")


def test_an_entry_missing_from_the_dump_is_an_artifact_error() -> None:
    with pytest.raises(KernelArtifactError, match=r"'other' is not in its SASS \(functions: \['peer_sum'\]\)"):
        sass.scan_kernel(_functions("clean"), "peer", "other")


@pytest.mark.parametrize(("line", "hit"), [
    ("/*0050*/   LDGMC.E.ADD.F32.RN.STRONG.SYS R3, [R2.64+URZ] ;", True),
    ("/*0060*/   @P0 LDGMC.E.ADD.F32x4.RN.STRONG.SYS R8, [R2.64+URZ] ;", True),
    ("/*0060*/   @!UP1 STGMC.E [R2.64], R4 ;", True),
    ("/*0070*/   MULTIMEM.ST.E [R2.64], R4 ;", True),
    ("/*0060*/   STG.E.STRONG.SYS desc[UR4][R2.64], R7 ;", False),
    ("/*0060*/   REDG.E.ADD.F32.FTZ.RN.STRONG.SYS desc[UR4][R2.64], R7 ;", False),
    ("/*0080*/   LDG.E.64 R4, desc[UR6][R2.64] ;", False),
    ("/*0090*/   IMAD.WIDE.U32 R2, R7, 0x4, R2 ;", False),
])
def test_multicast_opcodes_by_mnemonic(line: str, hit: bool) -> None:
    assert bool(sass.multicast_lines([line])) == hit


def test_cuobjdump_missing_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuda.pathfinder

    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_binary_utility", lambda _name: None)
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(MissingToolError, match=r"cuobjdump not found .*\(nvidia-cuda-cuobjdump\)"):
        sass.cuobjdump_path()
    with pytest.raises(MissingToolError):
        sass.dump_sass(b"\x7fELF", "m")


def test_cuobjdump_found_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cuda.pathfinder

    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\necho '	Function : k'\necho '        /*0000*/   LDGMC.E R1, [R2.64] ;'\n")
    tool.chmod(0o755)
    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_binary_utility", lambda _name: None)
    monkeypatch.setattr(shutil, "which", lambda _name: str(tool))
    assert sass.cuobjdump_path() == str(tool)
    functions = sass.sass_functions(sass.dump_sass(b"image", "m"))
    with pytest.raises(KernelArtifactError, match="multicast"):
        sass.scan_kernel(functions, "m", "k")


def test_a_failing_cuobjdump_is_an_artifact_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cuda.pathfinder

    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\necho 'cuobjdump fatal   : not an ELF' >&2\nexit 1\n")
    tool.chmod(0o755)
    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_binary_utility", lambda _name: str(tool))
    with pytest.raises(KernelArtifactError, match=r"cuobjdump -sass failed .*not an ELF"):
        sass.dump_sass(b"junk", "m")
