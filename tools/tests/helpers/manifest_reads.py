"""kern_manifest's parse and verify calls counted from a cold start, for the tests that hold a
manifest to being read once per process (packages/kern-runtime/tests/test_read_manifest.py,
tools/tests/test_engine_interp.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import kern_manifest as km
from kern_runtime import _manifest

__all__ = ["counted_reads"]


@contextmanager
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """`{"parse": n, "check": n}`: the calls of `kern_manifest.parse_manifest` and `kern_manifest.check`
    (as kern_runtime makes them, through the module) while the test runs; kern_runtime's cache of
    verified manifest texts is emptied on entry (no text read before) and on exit."""
    seen = {"parse": 0, "check": 0}
    parse, check = km.parse_manifest, km.check

    def counted_parse(data: str | bytes) -> km.Manifest:
        seen["parse"] += 1
        return parse(data)

    def counted_check(model: km.Manifest) -> list[km.ManifestVerify]:
        seen["check"] += 1
        return check(model)

    monkeypatch.setattr(km, "parse_manifest", counted_parse)
    monkeypatch.setattr(km, "check", counted_check)
    _manifest._model_of.cache_clear()  # pyright: ignore[reportPrivateUsage]
    try:
        yield seen
    finally:
        _manifest._model_of.cache_clear()  # pyright: ignore[reportPrivateUsage]
