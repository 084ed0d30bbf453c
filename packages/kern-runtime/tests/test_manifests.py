"""The GPU tests' manifests pass kern_manifest's verifier (checked here without a GPU)."""

from __future__ import annotations

import json

import pytest

from kern_manifest import check, parse_manifest

from .helpers import manifests

SHA = "ab" * 32


@pytest.mark.parametrize(
    "doc",
    [
        manifests.basic(SHA),
        manifests.basic(SHA, "i64"),
        manifests.features(SHA),
        manifests.chain(SHA),
        manifests.gemm(),
        manifests.gemm({"id": 999999}),
        manifests.same_name(SHA, 2),
        manifests.pooled(SHA),
        manifests.remapping(SHA),
        manifests.two_paged(SHA),
    ],
    ids=["basic", "basic-i64", "features", "chain", "gemm", "gemm-algo", "same-name", "pooled", "remapping",
         "two-paged"],
)
def test_test_manifests_verify(doc: dict[str, object]) -> None:
    problems = check(parse_manifest(json.dumps(doc)))
    assert [p.line() for p in problems] == []
