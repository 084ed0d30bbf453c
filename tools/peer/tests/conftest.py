"""The peer's host tests' checkpoint: a Qwen3-4B config.json beside an empty shard (no weights are
read before torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kern_qwen3 import QWEN3_4B_CONFIG


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(QWEN3_4B_CONFIG)))
    (d / "model-00001-of-00001.safetensors").write_bytes(b"")
    return d
