"""The manifest digest: sha256 over canonical JSON.

The canonical form is the model's JSON (`manifest_to_json`: unset optional fields dropped, defaults
written out) serialized with sorted keys, no whitespace and UTF-8 text. Two files that differ only in
key order, whitespace, number spelling (`1e3` vs `1000.0`) or spelled-out defaults have the same
digest; any change of meaning changes it. Ranks of one deployment compare digests before they
connect.
"""

from __future__ import annotations

import hashlib
import json

from kern_manifest.schema import Manifest, manifest_to_json, parse_manifest

__all__ = ["canonical_json", "digest", "digest_text"]


def canonical_json(manifest: Manifest) -> bytes:
    """The canonical UTF-8 JSON bytes of a manifest."""
    return json.dumps(
        manifest_to_json(manifest),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def digest(manifest: Manifest) -> str:
    """The sha256 hex digest of the manifest's canonical JSON."""
    return hashlib.sha256(canonical_json(manifest)).hexdigest()


def digest_text(data: str | bytes) -> str:
    """Parses manifest text and returns its digest.

    Raises:
        ManifestRejected: the text does not parse as a manifest.
    """
    return digest(parse_manifest(data))
