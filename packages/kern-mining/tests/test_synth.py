from __future__ import annotations

import json
from pathlib import Path

from kern_mining.fit import Fit
from kern_mining.synth import SynthSpec, write_capture


def test_ground_truth_matches_what_was_written(tmp_path: Path) -> None:
    truth = write_capture(SynthSpec(), tmp_path)
    lines = (tmp_path / "launches.jsonl").read_text().splitlines()
    assert len(lines) == truth.launches
    assert truth.windows == ((512, 256), (7, 1, 1, 1), (34, 1, 1, 1), (85, 1, 1, 1), (175, 1, 1, 1))
    finals = [json.loads(x) for x in lines if json.loads(x)["symbol"] == "rms_norm"]
    assert [r["grid"][0] for r in finals] == [t for w in truth.windows for t in w]
    assert truth.tokens_references == {"rms_norm"}
    assert truth.sites[("cache_write", 2)].grid[0] == Fit("ceil_div_mul", a=3, c=4)
    assert truth.sites[("cache_write", 2)].pointers == {
        0: "workspace",
        1: "persistent",
        2: "persistent",
    }


def test_the_same_seed_writes_the_same_capture(tmp_path: Path) -> None:
    write_capture(SynthSpec(seed=7), tmp_path / "a")
    write_capture(SynthSpec(seed=7), tmp_path / "b")
    write_capture(SynthSpec(seed=8), tmp_path / "c")
    a, b, c = ((tmp_path / x / "launches.jsonl").read_text() for x in "abc")
    assert a == b != c


def test_a_stable_buffer_with_one_user_is_a_weight_in_the_truth(tmp_path: Path) -> None:
    truth = write_capture(SynthSpec(layers=1, prompts=(3, 17, 40), warmup=()), tmp_path)
    assert truth.sites[("rope", 0)].pointers == {0: "workspace", 1: "weight"}
    assert truth.tokens_references == {"rms_norm", "fused_add_rms_norm", "rope"}
    assert truth.sites[("cache_write", 0)].pointers == {
        0: "workspace",
        1: "persistent",
        2: "weight",
    }


def test_module_hashes_match_the_files(tmp_path: Path) -> None:
    import hashlib

    write_capture(SynthSpec(), tmp_path)
    for line in (tmp_path / "modules.jsonl").read_text().splitlines():
        record = json.loads(line)
        blob = (tmp_path / f"module_{record['id']}.cubin").read_bytes()
        assert record["sha256"] == hashlib.sha256(blob).hexdigest()
        assert record["bytes"] == len(blob)
