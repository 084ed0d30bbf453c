"""kern_runtime.nccl on the host: the NCCL variables, collective sizes, the missing binding."""

from __future__ import annotations

import importlib

import pytest

from kern_runtime import ManifestUnsupportedError, NcclError, nccl


def test_environment_is_set_only_where_unset() -> None:
    env = {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0"}
    got = nccl.set_environment(env)
    assert got == {"NCCL_RUNTIME_CONNECT": "0", "NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0"}
    assert env["NCCL_PROTO"] == "LL"
    fresh: dict[str, str] = {}
    assert nccl.set_environment(fresh) == {"NCCL_RUNTIME_CONNECT": "0", "NCCL_PROTO": "LL,LL128",
                                           "NCCL_NVLS_ENABLE": "0"}


@pytest.mark.parametrize(("verb", "send", "recv"), [
    ("allreduce", 6, 6), ("allgather", 6, 24), ("reducescatter", 24, 6), ("alltoall", 24, 24)])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_collective_element_counts(verb: str, dt: str, send: int, recv: int) -> None:
    assert nccl.collective_bytes(f"extern:nccl_{verb}_{dt}", 6, 4) == (send, recv)


def test_missing_binding_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", refuse)
    with pytest.raises(ManifestUnsupportedError, match=r"nccl4py is not installed .* kern-runtime\[gpu\]"):
        nccl.bindings()


def test_a_unique_id_of_the_wrong_size_is_refused_before_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl, "bindings", lambda: pytest.fail("NCCL reached"))
    with pytest.raises(NcclError, match="128 bytes, got 3"):
        nccl._uid(b"abc")  # pyright: ignore[reportPrivateUsage]
