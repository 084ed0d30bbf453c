"""The tiny Qwen3 a GPU test runs: tools/kernels-src built, its manifest generated (device-fed when
the kernels have the feed entries) and a seeded random checkpoint written, all under one folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parents[2]


def build_tiny(tmp: Path, seed: int = 5) -> dict[str, Any]:
    """{"manifest", "kernels", "ckpt", "tmp"} of the tiny Qwen3 under `tmp`."""
    from helpers.qwen3_options import generate

    import kern_qwen3 as gen
    from kern_mining.build import build_kernels
    from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

    hashes = {
        m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", tmp / "kernels").items()
    }
    entries = gen.entry_modules(TOOLS / "kernels-src")
    feed = "device" if all(e in entries for e in gen.DEVICE_FEED_ENTRIES) else "host"
    m = generate(
        gen.shape_from_config(QWEN3_TINY_CONFIG), hashes, entries, model="qwen3-tiny", feed=feed
    )
    manifest = tmp / "qwen3-tiny.json"
    manifest.write_text(json.dumps(m))
    ckpt, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=seed, name="tiny", root=tmp)
    return {"manifest": manifest, "kernels": tmp / "kernels", "ckpt": ckpt, "tmp": tmp}
