"""Serving roles from the kern_manifest model and prefill chunk plans (no GPU)."""

from __future__ import annotations

import pytest

import kern_runtime as kr

from .helpers.manifests import parsed, serving


def test_roles_from_fills_and_batches() -> None:
    r = kr.serving_roles(parsed(serving()))
    assert (r.token, r.position, r.slot, r.seq_len, r.blocks, r.next_token) == ("ids", "pos", "sl", "len", "bt", "nt")
    assert (r.chunk_program, r.chunk_var, r.chunk_max, r.step_program, r.blocks_len) == ("chunk", "tokens", 256, "step", 64)
    assert r.step_vars == {"tokens": 1}
    assert (r.start_program, r.token_max, r.position_max, r.page_tokens) == (None, None, None, 1)


def test_roles_read_domains() -> None:
    m = serving()
    m["buffers"]["ids"]["domain"] = {"min": 0, "max": 4095}
    m["buffers"]["pos"]["domain"] = {"min": 0, "max": 99}
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    r = kr.serving_roles(parsed(m))
    assert (r.token_max, r.position_max, r.page_tokens) == (4095, 99, 16)
    assert r.reach(4096) == 100  # the position bound is tighter than 64 pages of 16
    m["buffers"]["pos"].pop("domain")
    assert kr.serving_roles(parsed(m)).reach(4096) == 64 * 16
    assert kr.serving_roles(parsed(serving())).reach(30) == 30  # nothing bounds it below the block table


def test_whole_pages_rounds_tokens_up_to_the_page_size() -> None:
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    r = kr.serving_roles(parsed(m))
    assert [r.whole_pages(t) for t in (1, 15, 16, 17, 100, 112)] == [16, 16, 16, 32, 112, 112]
    assert [r.pages_of(t) for t in (1, 16, 17, 112)] == [1, 1, 2, 7]
    assert kr.serving_roles(parsed(serving())).whole_pages(7) == 7  # pages of one token


def test_roles_find_the_step_seed_program() -> None:
    m = serving()
    m["programs"]["start"] = {"calls": []}
    assert kr.serving_roles(parsed(m)).start_program == "start"
    m["programs"]["other"] = {"calls": []}
    with pytest.raises(kr.ServingRolesError, match="several plain programs"):
        kr.serving_roles(parsed(m))


def _with_head(m: dict[str, object]) -> dict[str, object]:
    """`serving()` plus a span_at input and a one-row program that reads it."""
    m["buffers"]["row"] = {"dtype": "i64", "shape": [1], "kind": "input", "fill": "span_at"}  # type: ignore[index]
    m["programs"]["first"] = {"batch": {"groups": 1, "rows": 1}, "graph": True,  # type: ignore[index]
                              "calls": [{"op": "gather", "args": [{"buf": "row"}]}]}
    return m


def test_roles_find_the_head_program() -> None:
    """The head is the one-row program that reads the span_at input; the step the other one."""
    r = kr.serving_roles(parsed(_with_head(serving())))
    assert (r.head_program, r.head_row, r.step_program) == ("first", "row", "step")
    plain = kr.serving_roles(parsed(serving()))
    assert (plain.head_program, plain.head_row) == (None, None)
    m = _with_head(serving())
    m["programs"]["step"]["calls"] = [{"op": "gather", "args": [{"buf": "row"}]}]  # type: ignore[index]
    with pytest.raises(kr.ServingRolesError, match=r"span_at input 'row' must be read by exactly one one-row "
                                                   r"program \(the head\), read by \['step', 'first'\]"):
        kr.serving_roles(parsed(m))
    m = _with_head(serving())
    m["programs"]["first"]["calls"] = []  # type: ignore[index]
    with pytest.raises(kr.ServingRolesError, match=r"read by \[\]"):
        kr.serving_roles(parsed(m))


@pytest.mark.parametrize(
    ("edit", "word"),
    [
        (lambda m: m["buffers"]["sl"].pop("fill"), "fill 'slot'"),
        (lambda m: m["buffers"]["w"].update(fill="token"), r"fill 'token', found \['ids', 'w'\]"),
        (lambda m: m["programs"]["chunk"]["batch"].update(rows=1), "one chunk program"),
        (lambda m: m["programs"].pop("step"), "one step program"),
        (lambda m: m["programs"]["chunk"]["batch"].update(rows="rows"), "'rows', which is no declared var"),
    ],
)
def test_roles_errors(edit: object, word: str) -> None:
    m = serving()
    edit(m)  # type: ignore[operator]
    with pytest.raises(kr.ServingRolesError, match=word):
        kr.serving_roles(parsed(m))
    assert not issubclass(kr.ServingRolesError, kr.ApiError)  # the provider acts, not the caller


def test_prefill_chunks_cover_all_but_the_last_token() -> None:
    assert kr.prefill_chunks(1, 512) == []
    assert kr.prefill_chunks(2, 512) == [(0, 1)]
    assert kr.prefill_chunks(709, 512) == [(0, 512), (512, 708)]
    assert kr.prefill_chunks(709, 97)[-1] == (679, 708) and len(kr.prefill_chunks(709, 97)) == 8
    assert kr.prefill_chunks(37, 1) == [(i, i + 1) for i in range(36)]


def test_prefill_chunks_through_the_last_token() -> None:
    assert kr.prefill_chunks(1, 512, last=True) == [(0, 1)]
    assert kr.prefill_chunks(709, 512, last=True) == [(0, 512), (512, 709)]
    assert kr.prefill_chunks(513, 512, last=True) == [(0, 512), (512, 513)]
    assert kr.prefill_chunks(0, 4, last=True) == []


@pytest.mark.parametrize(("length", "chunk"), [(10, 0), (10, -3), (-1, 4)])
def test_prefill_chunks_refuse_bad_sizes(length: int, chunk: int) -> None:
    with pytest.raises(kr.PromptError, match="chunk >= 1"):
        kr.prefill_chunks(length, chunk)


def _batched() -> dict[str, object]:
    """`serving` plus a batched step of 8 one-row sequences over the var `rows` and its buffers."""
    m = serving()
    m["vars"]["rows"] = {"max": 8}
    b = m["buffers"]
    b["bt"] = {"dtype": "i32", "shape": [8, 64], "kind": "input", "fill": "blocks"}
    b["valid"] = {"dtype": "i32", "shape": [8], "kind": "input", "fill": "valid"}
    b["prm"] = {"dtype": "f32", "shape": [8, 4], "kind": "input", "fill": "sampling"}
    b["seed"] = {"dtype": "i64", "shape": [8], "kind": "input", "fill": "seed"}
    b["lp"] = {"dtype": "f32", "shape": [8, 6], "kind": "output", "fill": "logprobs"}
    b["top"] = {"dtype": "i64", "shape": [8, 5], "kind": "output", "fill": "top_tokens"}
    m["programs"]["many"] = {"batch": {"groups": 8, "rows": 1}, "graph": True,
                             "calls": [{"op": "x", "args": [{"buf": "prm"}, {"var": "rows"}]}]}
    m["programs"]["seed_rows"] = {"calls": [{"op": "s", "args": [{"buf": "valid"}]}]}
    m["programs"]["start"] = {"calls": []}
    return m


def test_roles_find_a_batched_step() -> None:
    r = kr.serving_roles(parsed(_batched()))
    assert r.blocks_len == 64 and r.start_program == "start" and r.step_program == "step"
    assert r.rows == kr.RowRoles(program="many", var="rows", max_rows=8, seed_program="seed_rows", valid="valid",
                                 sampling="prm", seed="seed", logprobs="lp", top_tokens="top", top_n=5, params=4)
    assert kr.serving_roles(parsed(serving())).rows is None


@pytest.mark.parametrize(("change", "words"), [
    (lambda m: m["buffers"].pop("seed"), "fills \\['seed'\\]"),
    (lambda m: m["programs"].pop("seed_rows"), "row seed program"),
    (lambda m: m["programs"].__setitem__("more", dict(m["programs"]["many"])), "one such program"),
    (lambda m: m["programs"]["many"]["calls"][0]["args"].append({"var": "tokens"}), "exactly one declared var"),
])
def test_a_broken_batched_step_is_one_line(change: object, words: str) -> None:
    m = _batched()
    change(m)  # type: ignore[operator]
    with pytest.raises(kr.ServingRolesError, match=words) as err:
        kr.serving_roles(parsed(m))
    assert "\n" not in str(err.value)
