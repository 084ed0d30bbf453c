"""Kernel artifacts on the host: hashing, fatbin splitting, ABI comparison."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from kern_runtime import KernelArtifactError
from kern_runtime.kernels import (
    first_mismatch,
    hash_dir,
    module_images,
    param_size,
    read_module,
    split_fatbin,
)

from .helpers.fatbin import pack_fatbin


def test_param_sizes() -> None:
    assert [param_size(p) for p in ["in buffer<bf16>", "inout state", "i32", "i64", "f32", "u8", "bytes<192>"]] == [
        8, 8, 4, 8, 4, 1, 192,
    ]  # fmt: skip


def test_layout_match_and_first_difference() -> None:
    sizes = [8, 4, 4, 8, 1]
    assert first_mismatch(sizes, [(0, 8), (8, 4), (12, 4), (16, 8), (24, 1)]) is None
    assert first_mismatch(sizes, [(0, 8), (8, 8), (16, 4), (24, 8), (32, 1)]) == "param 1 is 8 bytes in the kernel, declared 4"
    assert first_mismatch(sizes, [(0, 8), (8, 4), (12, 4), (16, 8)]) == "declares 5 params, the kernel has 4"
    assert "offset 20" in str(first_mismatch([8, 4], [(0, 8), (20, 4)]))


def test_bytes_param_takes_the_kernels_alignment() -> None:
    assert first_mismatch([192, 8], [(0, 192), (192, 8)]) is None
    assert first_mismatch([4, 128], [(0, 4), (64, 128)]) is None


def test_split_fatbin_keeps_this_arch_elf_images() -> None:
    a, b, other = b"\x7fELFaaaa", b"\x7fELFbbbbbb", b"\x7fELFcc"
    fat = pack_fatbin([(90, a), (80, other), (90, b)])
    pieces = split_fatbin(fat, 90)
    assert len(pieces) == 2
    for piece, image in zip(pieces, (a, b), strict=True):
        assert struct.unpack_from("<I", piece)[0] == 0xBA55ED50
        assert piece[16 + 64 :].rstrip(b"\0") == image
        assert split_fatbin(piece, 90) == [piece]
    assert module_images(fat, 80)[0][16 + 64 :].rstrip(b"\0") == other
    assert module_images(b"\x7fELF-plain-cubin", 90) == [b"\x7fELF-plain-cubin"]


def test_modules_are_found_by_hash_not_name(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "whatever.bin").write_bytes(b"cubin-one")
    hashes = hash_dir(tmp_path)
    sha = hashlib.sha256(b"cubin-one").hexdigest()
    assert read_module(hashes, "core", sha) == b"cubin-one"
    with pytest.raises(KernelArtifactError, match="module 'core': no file with sha256 0000"):
        read_module(hashes, "core", "0" * 64)
    with pytest.raises(KernelArtifactError, match="does not exist"):
        hash_dir(tmp_path / "none")
