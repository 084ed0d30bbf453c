from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.dumps import launch, synthetic, write_dump

from kern_mining.dump import RecordedLaunch, load_dump, resolve_dump_dir
from kern_mining.errors import AmbiguousDumpError, CorruptDumpError, EmptyDumpError


def test_loads_a_synthetic_dump_from_its_capture_root(tmp_path: Path) -> None:
    pid, truth = synthetic(tmp_path)
    dump = load_dump(pid.parent)
    assert dump.path == pid
    assert len(dump.launches) == truth.launches
    assert dump.notes == ()
    assert set(dump.modules) == {1, 2, 3}
    assert all(m.present for m in dump.modules.values())
    times = [la.t_ns for la in dump.launches]
    assert times == sorted(times)


def test_launch_records_have_no_instance_dict(tmp_path: Path) -> None:
    pid, _ = synthetic(tmp_path)
    first: RecordedLaunch = load_dump(pid).launches[0]
    assert not hasattr(first, "__dict__")


def test_params_decode(tmp_path: Path) -> None:
    params = [
        {
            "offset": 0,
            "size": 8,
            "data": (0x7000_0000_0100).to_bytes(8, "little").hex(),
            "pointer": {
                "memory_type": "device",
                "range_start": 0x7000_0000_0000,
                "range_size": 4096,
            },
        },
        {"offset": 8, "size": 4, "data": "e8030000", "pointer": None},
    ]
    d = write_dump(
        tmp_path / "d", [launch(1, params=params), launch(2, params="unknown-layout"), launch(3)]
    )
    a, b, c = load_dump(d).launches
    assert isinstance(a.params, tuple)
    assert a.params[1].value == 1000
    assert a.params[0].pointer is not None and a.params[0].pointer.range_size == 4096
    assert b.params == "unknown-layout"
    assert c.params is None


def test_a_truncated_last_line_is_dropped_with_a_note(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [launch(i) for i in range(5)])
    text = (d / "launches.jsonl").read_text()
    (d / "launches.jsonl").write_text(text[:-20])
    dump = load_dump(d)
    assert len(dump.launches) == 4
    assert any("truncated last line 5" in n for n in dump.notes)


def test_a_corrupt_line_in_the_middle_names_the_line(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [launch(i) for i in range(5)])
    lines = (d / "launches.jsonl").read_text().splitlines()
    lines[2] = lines[2][:30]
    (d / "launches.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDumpError, match=r"launches.jsonl:3:"):
        load_dump(d)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("grid", [1, 2]),
        ("t_ns", -1),
        ("symbol", 3),
        ("params", {"x": 1}),
        ("module", "m"),
        ("cluster", "no"),
    ],
)
def test_a_record_with_a_bad_field_is_corrupt(tmp_path: Path, key: str, value: object) -> None:
    record = launch(1)
    record[key] = value
    d = write_dump(tmp_path / "d", [launch(0), record, launch(2)])
    with pytest.raises(CorruptDumpError, match=r":2:"):
        load_dump(d)


def test_a_param_whose_hex_does_not_match_its_size_is_corrupt(tmp_path: Path) -> None:
    params = [{"offset": 0, "size": 4, "data": "00", "pointer": None}]
    d = write_dump(tmp_path / "d", [launch(0, params=params), launch(1)])
    with pytest.raises(CorruptDumpError, match=r":1: param 'data'"):
        load_dump(d)


def test_a_missing_key_is_corrupt(tmp_path: Path) -> None:
    record = launch(1)
    del record["grid"]
    d = write_dump(tmp_path / "d", [record, launch(2)])
    with pytest.raises(CorruptDumpError, match="missing key 'grid'"):
        load_dump(d)


def test_an_empty_launches_file_is_an_empty_dump(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [])
    with pytest.raises(EmptyDumpError, match="no launches"):
        load_dump(d)


def test_an_empty_directory_is_an_empty_dump(tmp_path: Path) -> None:
    with pytest.raises(EmptyDumpError, match="capture first"):
        load_dump(tmp_path)


def test_several_process_dumps_must_be_named(tmp_path: Path) -> None:
    write_dump(tmp_path / "pid1", [launch(0)])
    write_dump(tmp_path / "pid2", [launch(0)])
    with pytest.raises(AmbiguousDumpError, match="pid1, pid2"):
        resolve_dump_dir(tmp_path)
    assert resolve_dump_dir(tmp_path / "pid2") == tmp_path / "pid2"


def test_missing_module_files_and_unknown_module_ids_are_noted(tmp_path: Path) -> None:
    record = launch(1)
    record["module"] = 9
    d = write_dump(tmp_path / "d", [launch(0), record], cubins={1: b"a", 2: b"b"})
    (d / "module_2.cubin").unlink()
    dump = load_dump(d)
    assert not dump.modules[2].present
    assert any("module 2: module_2.cubin is missing" in n for n in dump.notes)
    assert any("[9]" in n for n in dump.notes)


def test_a_missing_modules_file_is_noted(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [launch(0)])
    (d / "modules.jsonl").unlink()
    assert any("modules.jsonl is missing" in n for n in load_dump(d).notes)


def test_a_corrupt_modules_file_names_the_line(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [launch(0)])
    (d / "modules.jsonl").write_text(
        json.dumps({"id": 1, "sha256": "ab", "bytes": 1, "functions": []}) + "\n"
    )
    with pytest.raises(CorruptDumpError, match=r"modules.jsonl:1: 'sha256'"):
        load_dump(d)


def test_a_gzipped_launches_file_loads_the_same(tmp_path: Path) -> None:
    pid, truth = synthetic(tmp_path)
    plain = load_dump(pid)
    raw = (pid / "launches.jsonl").read_bytes()
    (pid / "launches.jsonl").unlink()
    (pid / "launches.jsonl.gz").write_bytes(gzip.compress(raw))
    packed = load_dump(pid.parent)
    assert packed.launches == plain.launches
    assert len(packed.launches) == truth.launches


def test_a_broken_gzip_file_is_corrupt(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [launch(0)])
    (d / "launches.jsonl").unlink()
    (d / "launches.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(CorruptDumpError, match="not a readable gzip"):
        load_dump(d)


def test_a_modules_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    d = write_dump(tmp_path / "d", [launch(0)])
    good = (d / "modules.jsonl").read_bytes()
    (d / "modules.jsonl").write_bytes(good + b"\xff\xfe\n")
    with pytest.raises(CorruptDumpError) as info:
        load_dump(d)
    assert str(info.value) == (
        f"{d / 'modules.jsonl'}:2: not UTF-8 text (byte {len(good)}); re-capture or cut the file before this line"
    )


@pytest.mark.parametrize("name", ["launches.jsonl", "modules.jsonl"])
def test_json_nested_too_deeply_is_corrupt(tmp_path: Path, name: str) -> None:
    d = write_dump(tmp_path / "d", [launch(0)])
    (d / name).write_text("[" * 100_000 + "\n")
    with pytest.raises(CorruptDumpError) as info:
        load_dump(d)
    assert str(info.value) == f"{d / name}:1: JSON nested too deeply; re-capture or cut the file before this line"
