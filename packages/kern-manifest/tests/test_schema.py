"""kern_manifest.schema: parsing, typed parse errors with pointers, garbage, helpers, round trips."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
from helpers.manifests import TINY, full, tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kern_manifest import (
    DTYPE_BYTES,
    EXTERN_SIGNATURES,
    MANIFEST,
    MAX_NAME,
    MAX_TEXT,
    BufArg,
    ExternLaunch,
    KernelLaunch,
    Manifest,
    ManifestParse,
    ManifestRejected,
    PackArg,
    PackTensormap,
    ParamType,
    call_vars,
    check,
    dtype_bytes,
    extern_signature,
    launch_vars,
    manifest_to_json,
    parse_manifest,
    parse_param,
)

# ---------------------------------------------------------------------------------- params


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("in buffer<bf16>", ParamType("buffer", "in", "bf16", 8)),
        ("out buffer<fp8e4m3>", ParamType("buffer", "out", "fp8e4m3", 8)),
        ("inout state", ParamType("state", "inout", None, 8)),
        ("i32", ParamType("scalar", "in", "i32", 4)),
        ("i64", ParamType("scalar", "in", "i64", 8)),
        ("f32", ParamType("scalar", "in", "f32", 4)),
        ("u8", ParamType("scalar", "in", "u8", 1)),
        ("bytes<192>", ParamType("bytes", "in", None, 192)),
    ],
)
def test_parse_param(text: str, expected: ParamType) -> None:
    p = parse_param(text)
    assert p == expected
    assert str(p) == text


def test_param_directions_and_pointers() -> None:
    assert parse_param("in buffer<f32>").reads and not parse_param("in buffer<f32>").writes
    assert parse_param("out state").writes and not parse_param("out state").reads
    assert parse_param("inout buffer<u8>").reads and parse_param("inout buffer<u8>").writes
    assert parse_param("inout state").is_pointer and not parse_param("i64").is_pointer


@pytest.mark.parametrize(
    "text",
    [
        "",
        "in",
        "buffer<bf16>",
        "in buffer<>",
        "in  buffer<bf16>",
        "u32",
        "bytes<0>",
        "bytes<n>",
        "in i32",
        "IN state",
    ],
)
def test_malformed_params(text: str) -> None:
    with pytest.raises(ManifestParse):
        parse_param(text)


def test_dtype_bytes() -> None:
    assert dtype_bytes("bf16") == 2 and dtype_bytes("fp8e8m0") == 1 and dtype_bytes("u64") == 8
    assert set(DTYPE_BYTES) == {
        "bf16",
        "f16",
        "f32",
        "fp8e4m3",
        "fp8e8m0",
        "i8",
        "i32",
        "u32",
        "i64",
        "u64",
        "u8",
    }


def test_extern_signatures() -> None:
    gemm = extern_signature("extern:cublaslt_bf16_tn")
    assert [str(p) for p in gemm.required] == [
        "in buffer<bf16>",
        "in buffer<bf16>",
        "out buffer<bf16>",
        "i32",
        "i32",
        "i32",
    ]
    assert len(gemm.optional) == 2 and gemm.algo
    assert str(extern_signature("extern:cublaslt_bf16_tn_acc").required[2]) == "inout buffer<bf16>"
    fp8 = extern_signature("extern:cublaslt_fp8_tn_f32")
    assert [str(p) for p in fp8.required[:5]] == [
        "in buffer<fp8e4m3>",
        "in buffer<fp8e4m3>",
        "out buffer<f32>",
        "in buffer<f32>",
        "in buffer<f32>",
    ]
    assert len(fp8.optional) == 1 and not fp8.algo
    nccl = [n for n in EXTERN_SIGNATURES if n.startswith("extern:nccl_")]
    assert len(nccl) == 8 and all(EXTERN_SIGNATURES[n].collective for n in nccl)
    assert [str(p) for p in extern_signature("extern:nccl_alltoall_bf16").required] == [
        "in buffer<bf16>",
        "out buffer<bf16>",
        "i64",
        "i32",
    ]


# ---------------------------------------------------------------------------------- model helpers


def test_buffer_sizes_and_var_bounds() -> None:
    m = parse_manifest(json.dumps(full()))
    assert m.var_max == {"tokens": 64, "seqs": 4}
    assert m.var_bounds == {"tokens": (1, 64), "seqs": (1, 4)}
    assert m.buffer_max_bytes("logits") == 64 * 1000 * 4
    assert m.buffers["h"].nbytes({"tokens": 3}) == 3 * 256 * 2
    assert m.buffers["h"].elements({"tokens": 3}) == 768
    assert m.ops["attn"].impl.scratch["partial"].nbytes({"seqs": 2}) == 2 * 8 * 256 * 4


def test_vars_read_by_launches_calls_and_programs() -> None:
    m = parse_manifest(json.dumps(full()))
    tma = m.ops["norm"].impl.launches[1]
    assert isinstance(tma, KernelLaunch)
    assert launch_vars(tma) == {"tokens"}
    gather = m.ops["gather"].impl.launches[0]
    assert isinstance(gather, ExternLaunch) and launch_vars(gather) == {"tokens"}
    attn = m.ops["attn"].impl.launches[0]
    assert launch_vars(attn) == {"seqs"}
    assert call_vars(m.programs["decode"].calls[7]) == {"tokens"}
    assert call_vars(m.programs["decode"].calls[0]) == frozenset()
    assert m.program_vars("decode") == {"tokens", "seqs"}
    assert m.program_vars("load") == frozenset()


def test_discriminated_unions_pick_the_right_models() -> None:
    m = parse_manifest(json.dumps(full()))
    launch = m.ops["norm"].impl.launches[1]
    assert isinstance(launch, KernelLaunch) and launch.args is not None
    pack = launch.args[0]
    assert isinstance(pack, PackArg) and isinstance(pack.pack.fields[0], PackTensormap)
    assert isinstance(m.ops["gemm"].impl.launches[0], ExternLaunch)
    arg = m.programs["decode"].calls[7].args[1]
    assert isinstance(arg, BufArg) and arg.offset.vars == {"tokens"}


def test_models_are_frozen() -> None:
    m = parse_manifest(json.dumps(full()))
    with pytest.raises(ValueError, match="frozen"):
        m.model = "other"  # type: ignore[misc]


def test_module_level_adapter() -> None:
    assert MANIFEST.validate_python(full()) == parse_manifest(json.dumps(full()))


# ---------------------------------------------------------------------------------- parse errors


def _parse_problems(data: str | bytes) -> list[ManifestParse]:
    with pytest.raises(ManifestRejected) as info:
        parse_manifest(data)
    found = list(info.value.problems)
    assert found and all(isinstance(p, ManifestParse) for p in found)
    return found  # type: ignore[return-value]


def test_duplicate_keys_are_rejected_with_their_pointer() -> None:
    text = json.dumps(full()).replace('"vars": {', '"vars": {"seqs": {"max": 2}, ', 1)
    (p,) = _parse_problems(text)
    assert p.pointer == "/vars/seqs" and "duplicate" in p.message


def test_pointer_escapes_names() -> None:
    doc = full()
    doc["buffers"]["a/b~c"] = {"dtype": "nope", "shape": [1], "kind": "workspace"}
    (p,) = _parse_problems(json.dumps(doc))
    assert p.pointer == "/buffers/a~1b~0c/dtype"


def test_every_parse_problem_is_reported() -> None:
    doc = full()
    doc["vars"]["tokens"]["max"] = "x"
    doc["buffers"]["h"]["kind"] = "nope"
    doc["ops"]["embed"]["params"][0] = "bad"
    pointers = {p.pointer for p in _parse_problems(json.dumps(doc))}
    assert pointers == {"/vars/tokens/max", "/buffers/h/kind", "/ops/embed/params/0"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"[]", "not an array"),
        (b'"manifest"', "not a string"),
        (b"null", "not null"),
        (b"5", "not a number"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b'{"schema_version": NaN}', "not JSON"),
        (b'{"schema_version": 5, "x": Infinity}', "not JSON"),
        (b"{" * 100_000, "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"schema_version": 1' + b"0" * 5000 + b"}", "not JSON"),
        (b'{"schema_version": 5, "model": 1' + b"0" * 5000 + b"}", "not JSON: a number too long"),
        (b'{"schema_version": "' + b"5" * 10_000_000 + b'"}', "schema_version '555"),
        (b'{"schema_version": "5"}', "schema_version '5' is not 5"),
        (b'{"schema_version": true}', "is not 5"),
    ],
)
def test_garbage_is_a_single_parse_problem(data: bytes, message: str) -> None:
    (p,) = _parse_problems(data)
    assert message in p.message
    assert p.hint
    assert "sys." not in p.line() and len(p.line()) < 200


# ---------------------------------------------------------------------------------- name lengths


def _name_at(pointer: str, name: str) -> dict[str, Any]:
    """full() with `name` in the name position `pointer` (a key is renamed, a value replaced)."""
    doc = full()
    node: Any = doc
    parts = pointer.split("/")[1:]
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if last.startswith("{") and last.endswith("}"):
        node[name] = node.pop(last[1:-1])
    else:
        node[int(last) if isinstance(node, list) else last] = name
    return doc


NAME_POSITIONS = [
    "/buffers/{x}",
    "/vars/{seqs}",
    "/ops/{argmax}",
    "/programs/{decode}",
    "/topology/groups/{tp}",
    "/model",
    "/programs/decode/calls/0/label",
    "/programs/decode/calls/0/op",
    "/programs/decode/calls/0/args/0/buf",
    "/buffers/emb/bind/0/tensor",
    "/buffers/ids/shape/0",
]


@pytest.mark.parametrize("pointer", NAME_POSITIONS)
def test_a_name_longer_than_max_name_is_a_parse_problem(pointer: str) -> None:
    found = _parse_problems(json.dumps(_name_at(pointer, "n" * (MAX_NAME + 1))))
    # NOTE: a checkpoint tensor is a name or a rank table: the second problem says it is no table
    assert len(found) == (2 if pointer.endswith("/tensor") else 1)
    assert found[0].message.endswith("longer than 256 characters")
    assert all(len(p.line()) < 200 for p in found)


@pytest.mark.parametrize("pointer", NAME_POSITIONS)
def test_a_name_of_max_name_characters_parses(pointer: str) -> None:
    parse_manifest(json.dumps(_name_at(pointer, "n" * MAX_NAME)))


def test_a_long_entry_or_constant_name_is_refused_in_a_short_line() -> None:
    doc = full()
    doc["ops"]["embed"]["impl"]["launches"][0]["entry"] = "e" * (MAX_TEXT + 1)
    doc["constants"] = {"C" * (MAX_NAME + 1): 1}
    found = _parse_problems(json.dumps(doc))
    assert [p.pointer for p in found] == ["/constants/" + "C" * (MAX_NAME + 1), "/ops/embed/impl/launches/0/entry"]
    assert all(len(p.line()) < 250 for p in found)
    assert found[1].message == f"entry of {MAX_TEXT + 1} characters"


def test_fifty_megabytes_of_random_bytes() -> None:
    data = os.urandom(50 * 1024 * 1024)
    (p,) = _parse_problems(data)
    assert p.pointer == ""


def test_bom_is_accepted() -> None:
    assert parse_manifest("\ufeff" + TINY.read_text()) == parse_manifest(TINY.read_bytes())


def test_every_truncation_of_the_example_is_rejected() -> None:
    text = TINY.read_bytes().rstrip()
    for end in range(0, len(text) - 1, 37):
        _parse_problems(text[:end])


def test_deep_but_valid_json_in_a_field() -> None:
    doc = full()
    nested: Any = 1
    for _ in range(500):
        nested = [nested]
    doc["model"] = nested
    (p,) = _parse_problems(json.dumps(doc))
    assert p.pointer == "/model"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_give_typed_errors_only(data: bytes) -> None:
    with pytest.raises(ManifestRejected):
        parse_manifest(data)


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_random_json_gives_typed_errors_only(value: Any) -> None:
    with pytest.raises(ManifestRejected):
        parse_manifest(json.dumps(value))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


_FULL_PATHS = _paths(full())[1:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_FULL_PATHS), _JSON)
def test_any_field_replaced_by_any_json_never_crashes(path: tuple[Any, ...], value: Any) -> None:
    doc = full()
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    try:
        manifest = parse_manifest(json.dumps(doc))
    except ManifestRejected as exc:
        assert all(isinstance(p, ManifestParse) for p in exc.problems)
        return
    for p in check(manifest):
        assert p.pointer.startswith("/") and p.message and p.hint


# ---------------------------------------------------------------------------------- round trips


def test_examples_round_trip() -> None:
    for doc in (full(), tiny()):
        m = parse_manifest(json.dumps(doc))
        again = manifest_to_json(m)
        assert parse_manifest(json.dumps(again)) == m
        assert manifest_to_json(parse_manifest(json.dumps(again))) == again


_NAMES = st.sampled_from(["a", "b", "h", "x.y", "l0/q"])
_EXPR = st.recursive(
    st.integers(0, 1 << 20) | st.sampled_from(["tokens", "seqs"]),
    lambda c: st.tuples(st.sampled_from(["add", "mul", "min", "max"]), c, c).map(
        lambda t: {t[0]: [t[1], t[2]]}
    ),
    max_leaves=5,
)
_PARAM = st.sampled_from(
    ["in buffer<bf16>", "out buffer<f32>", "inout state", "i32", "i64", "f32", "u8", "bytes<64>"]
)
_LAUNCH_ARG = st.one_of(
    st.builds(lambda i: {"param": i}, st.integers(0, 9)),
    st.builds(lambda n: {"scratch": n}, _NAMES),
    st.builds(lambda v: {"i32": v}, st.integers(-(1 << 31), (1 << 31) - 1)),
    st.builds(lambda v: {"i64": v}, st.integers(-(1 << 63), (1 << 63) - 1)),
    st.builds(lambda v: {"f32": v}, st.floats(-1e30, 1e30)),
    st.builds(lambda v: {"u8": v}, st.integers(0, 255)),
    st.builds(lambda v: {"var": v}, st.sampled_from(["tokens", "seqs"])),
    st.builds(lambda e: {"expr": e}, _EXPR),
    st.builds(lambda g: {"rank": g}, _NAMES),
    st.builds(
        lambda at, i, e: {
            "pack": {
                "size": 256,
                "fields": [
                    {"at": at, "param": i},
                    {"at": 64, "expr": e, "width": 8},
                    {
                        "at": 128,
                        "tensormap": {
                            "param": i,
                            "dtype": "bf16",
                            "dims": [e, 64],
                            "strides": [128],
                            "box": [8, 8],
                        },
                    },
                ],
            }
        },
        st.integers(0, 60),
        st.integers(0, 4),
        _EXPR,
    ),
)
_CALL_ARG = st.one_of(
    st.builds(lambda n, o: {"buf": n, "offset": o}, _NAMES, _EXPR),
    st.builds(lambda n: {"state": n}, _NAMES),
    st.builds(lambda v: {"var": v}, st.sampled_from(["tokens", "seqs"])),
    st.builds(lambda e: {"expr": e}, _EXPR),
    st.builds(lambda v: {"f32": v}, st.floats(-1e30, 1e30)),
    st.builds(lambda g: {"rank": g}, _NAMES),
)
_KERNEL = st.builds(
    lambda grid, smem, args, params, pdl, when: {
        "module": "m",
        "entry": "k",
        "block": [128, 1, 1],
        "grid": grid,
        "shared_mem": smem,
        "args": args,
        "params": params,
        "pdl": pdl,
        **({"when": when} if when else {}),
    },
    st.lists(_EXPR, min_size=3, max_size=3),
    _EXPR,
    st.lists(_LAUNCH_ARG, max_size=4),
    st.lists(_PARAM, max_size=4),
    st.booleans(),
    st.none() | st.builds(lambda lo: {"var": "tokens", "min": lo}, st.integers(1, 9)),
)
_EXTERN = st.builds(
    lambda entry, args, algo: {
        "entry": entry,
        "args": args,
        **({"algo": {"id": algo}} if algo is not None else {}),
    },
    st.sampled_from(sorted(EXTERN_SIGNATURES)),
    st.lists(_LAUNCH_ARG, max_size=4),
    st.none() | st.integers(0, 40),
)
_BUFFER = st.builds(
    lambda dtype, shape, kind, export: {
        "dtype": dtype,
        "shape": shape,
        "kind": kind,
        "export": export,
    },
    st.sampled_from(sorted(DTYPE_BYTES)),
    st.lists(_EXPR, min_size=1, max_size=3),
    st.sampled_from(["input", "output", "workspace", "carry"]),
    st.booleans(),
)
_DOC = st.builds(
    lambda buffers, ops, calls, flags: {
        "schema_version": 5,
        "model": "gen",
        "vars": {"tokens": {"max": 64}, "seqs": {"max": 8}},
        "states": {"kv": {"bytes_per_token": 512}},
        "buffers": buffers,
        "modules": {"m": {"source": "m.cubin", "sha256": "0" * 64}},
        "ops": {
            f"op{i}": {
                "params": [p for p, _ in op],
                "impl": {"launches": [launch for _, launch in op]},
            }
            for i, op in enumerate(ops)
        },
        "programs": {"p": {"calls": [{"op": "op0", "args": c} for c in calls], **flags}},
    },
    st.dictionaries(_NAMES, _BUFFER, max_size=4),
    st.lists(
        st.lists(st.tuples(_PARAM, _KERNEL | _EXTERN), min_size=1, max_size=3),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.lists(_CALL_ARG, max_size=4), max_size=4),
    st.fixed_dictionaries(
        {},
        optional={
            "graph": st.booleans(),
            "once": st.booleans(),
            "batch": st.just({"groups": 2, "rows": "tokens"}),
        },
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOC)
def test_model_json_model_round_trip(doc: dict[str, Any]) -> None:
    m = parse_manifest(json.dumps(doc))
    assert isinstance(m, Manifest)
    dumped = manifest_to_json(m)
    assert parse_manifest(json.dumps(dumped)) == m
    # NOTE: the verifier must never crash on a parseable manifest, however wrong.
    for p in check(m):
        assert p.pointer.startswith("/") and p.hint


def test_import_loads_no_gpu_or_ml_library() -> None:
    import subprocess

    code = (
        "import sys, kern_manifest; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cuda', 'torch', 'cupy', 'transformers')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
