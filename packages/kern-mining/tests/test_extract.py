from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers.dumps import launch, write_dump

from kern_mining.errors import KernelConflictError, ManifestModulesError, MissingModuleError
from kern_mining.extract import extract_kernels, index_cubins

A, B, C = b"cubin A", b"cubin B", b"cubin C"


def sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def manifest(path: Path, modules: object) -> Path:
    path.write_text(json.dumps({"version": 5, "modules": modules}))
    return path


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    root = tmp_path / "capture"
    write_dump(root / "pid1", [launch(0)], cubins={1: A, 2: B})
    write_dump(root / "pid2", [launch(0)], cubins={1: C})
    return root


def test_copies_modules_by_hash_from_any_process_dump(tmp_path: Path, capture: Path) -> None:
    m = manifest(
        tmp_path / "m.json",
        {"norm": {"source": "x", "sha256": sha(B)}, "rope": {"source": "y", "sha256": sha(C)}},
    )
    report = extract_kernels(capture, m, tmp_path / "kernels")
    names = sorted(p.name for p in report.added)
    assert names == [f"norm-{sha(B)[:12]}.cubin", f"rope-{sha(C)[:12]}.cubin"]
    assert (tmp_path / "kernels" / names[0]).read_bytes() == B
    assert report.present == ()


def test_extraction_only_adds(tmp_path: Path, capture: Path) -> None:
    m = manifest(tmp_path / "m.json", {"norm": {"source": "x", "sha256": sha(A)}})
    extract_kernels(capture / "pid1", m, tmp_path / "kernels")
    again = extract_kernels(capture / "pid1", m, tmp_path / "kernels")
    assert again.added == ()
    assert [p.name for p in again.present] == [f"norm-{sha(A)[:12]}.cubin"]


def test_a_file_with_other_bytes_is_a_conflict_and_nothing_is_written(
    tmp_path: Path, capture: Path
) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / f"norm-{sha(A)[:12]}.cubin").write_bytes(b"tampered")
    m = manifest(
        tmp_path / "m.json",
        {"norm": {"source": "x", "sha256": sha(A)}, "zeta": {"source": "z", "sha256": sha(B)}},
    )
    with pytest.raises(KernelConflictError, match="only adds"):
        extract_kernels(capture, m, kernels)
    assert sorted(p.name for p in kernels.iterdir()) == [f"norm-{sha(A)[:12]}.cubin"]


def test_missing_hashes_are_all_listed_and_nothing_is_written(
    tmp_path: Path, capture: Path
) -> None:
    other = "ab" * 32
    m = manifest(
        tmp_path / "m.json",
        {
            "norm": {"source": "x", "sha256": sha(A)},
            "gemm": {"source": "g", "sha256": other},
            "attn": {"source": "a", "sha256": "cd" * 32},
        },
    )
    with pytest.raises(MissingModuleError, match=r"attn \(cdcdcdcdcdcd\), gemm \(abababababab\)"):
        extract_kernels(capture, m, tmp_path / "kernels")
    assert not (tmp_path / "kernels").exists()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "cannot read it as JSON"),
        (json.dumps({"version": 5}), 'no "modules" table'),
        (json.dumps({"modules": {}}), 'no "modules" table'),
        (json.dumps({"modules": {"a": {"source": "x"}}}), "no 64-hex"),
        (json.dumps({"modules": {"a": {"source": "x", "sha256": "AB" * 32}}}), "no 64-hex"),
        (
            json.dumps({"modules": {"../a": {"source": "x", "sha256": "ab" * 32}}}),
            "not a plain file-name stem",
        ),
        (json.dumps([1, 2]), 'no "modules" table'),
    ],
)
def test_a_bad_manifest_is_a_typed_error(
    tmp_path: Path, capture: Path, text: str, match: str
) -> None:
    m = tmp_path / "m.json"
    m.write_text(text)
    with pytest.raises(ManifestModulesError, match=match):
        extract_kernels(capture, m, tmp_path / "kernels")


def test_a_missing_manifest_is_a_typed_error(tmp_path: Path, capture: Path) -> None:
    with pytest.raises(ManifestModulesError, match="cannot read"):
        extract_kernels(capture, tmp_path / "absent.json", tmp_path / "kernels")


def test_index_hashes_file_bytes(capture: Path) -> None:
    index = index_cubins(capture)
    assert set(index) == {sha(A), sha(B), sha(C)}
    assert index[sha(C)].parent.name == "pid2"
