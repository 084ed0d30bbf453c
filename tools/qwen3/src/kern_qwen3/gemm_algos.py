"""cuBLASLt algorithms pinned by m range for the GEMMs whose m is a var (the prefill chunk's
`tokens`, the batched step's `rows`), and the pass that writes them (`GemmAlgos`).

cuBLASLt's heuristic ranks its candidates without running them, and its first choice is not the
fastest everywhere: on the H200 the fastest candidate of `tools/lab/sweep_gemm.py` (each timed at
20 m from 1 to 2,048 over weights rotated past L2) beats it by 16 % for gate_up at m 2,048, by
26 % for o at m 1 to 24, and by 10 % for gate_up at m 1 to 128, while at m 200 to 709 most GEMMs
have nothing better (tools/lab/notes/kernel-experiments.md). A table lists, per (n, k), runs of m
from their first m to the next run's: a run pinned to one algo (its manifest `algo` fields), or
left to the heuristic (None). The pass gives every such GEMM call its own op with one launch per
run (`when` on the call's m var; the runtime AlgoChecks each pin at both ends of its range), so
calls of other shapes keep the heuristic's `gemm` op. (A one-row step on cuBLASLt calls its GEMMs at
m = tokens = 1: the first run's pin.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kern_qwen3.errors import GenError
from kern_qwen3.fragments import Json
from kern_qwen3.plan import Context, Plan
from kern_qwen3.shape import Qwen3Shape

__all__ = ["GEMM_ALGO_TABLES", "GemmAlgos", "Run"]

Algo = tuple[int, int, int, int, int, int, int, int, int]
"""(id, tile, split_k, reduction, swizzle, custom, stages, inner_shape, cluster_shape)."""
Run = tuple[int, Algo | None]
"""(first m, its algo or None for the heuristic's); a run ends where the next one starts."""

_FIELDS = ("id", "tile", "split_k", "reduction", "swizzle", "custom", "stages", "inner_shape", "cluster_shape")

_H200: Mapping[tuple[int, int], tuple[Run, ...]] = MappingProxyType({
    (6144, 2560): (  # qkv
        (1, (66, 394, 1, 0, 0, 3, 35, 0, 7)), (48, (66, 124, 1, 0, 0, 0, 35, 0, 4)), (96, None),
        (1024, (66, 20, 1, 0, 0, 1, 35, 0, 3)), (1536, (66, 458, 1, 0, 0, 3, 35, 0, 5)),
        (2048, (66, 20, 1, 0, 0, 1, 35, 0, 3)),
    ),
    (2560, 4096): (  # o
        (1, (66, 10, 1, 0, 0, 1, 35, 0, 4)), (12, (66, 312, 1, 0, 0, 1, 35, 0, 4)),
        (32, (66, 13, 1, 0, 0, 1, 35, 0, 4)), (96, (66, 15, 1, 0, 0, 3, 35, 0, 7)),
        (200, (66, 27, 1, 0, 0, 2, 35, 0, 9)), (256, None),
    ),
    (19456, 2560): (  # gate_up
        (1, (66, 196, 1, 0, 0, 0, 35, 0, 4)), (200, None), (384, (66, 165, 1, 0, 0, 0, 35, 0, 3)),
        (512, None), (1024, (66, 197, 1, 0, 0, 0, 35, 0, 4)), (2048, (66, 184, 1, 0, 0, 2, 35, 0, 5)),
    ),
    (2560, 9728): (  # down
        (1, (66, 393, 3, 2, 0, 3, 35, 0, 7)), (8, (66, 394, 3, 2, 0, 3, 35, 0, 7)), (48, None),
        (200, (66, 317, 1, 0, 0, 1, 35, 0, 4)), (256, (66, 27, 1, 0, 0, 2, 35, 0, 9)), (384, None),
    ),
    (151936, 2560): (  # lm_head
        (1, (66, 486, 1, 0, 0, 3, 35, 0, 5)), (24, None), (256, (66, 184, 1, 0, 0, 2, 35, 0, 5)),
        (384, (66, 32, 1, 0, 0, 4, 35, 0, 3)), (512, (66, 184, 1, 0, 0, 2, 35, 0, 5)),
        (1536, (66, 209, 1, 0, 0, 4, 35, 0, 3)),
    ),
})  # fmt: skip

GEMM_ALGO_TABLES: Mapping[str, Mapping[tuple[int, int], tuple[Run, ...]]] = MappingProxyType({"h200": _H200})
"""Name (`kern-qwen3 --gemm-algos NAME`) -> (n, k) -> runs. `h200`: one H200 (sm_90) with the
cuBLASLt of uv.lock's nvidia-cublas, measured by tools/lab/sweep_gemm.py."""

def _literal(arg: Json) -> int | None:
    return int(arg["i32"]) if set(arg) == {"i32"} else None


def _launches(runs: tuple[Run, ...], var: str, top: int) -> list[Json]:
    """One extern launch per run that starts within [1, top], its `when` clipped to the var's."""
    out: list[Json] = []
    for i, (lo, algo) in enumerate(runs):
        if lo > top:
            break
        hi = runs[i + 1][0] - 1 if i + 1 < len(runs) else top
        launch: Json = {"entry": "extern:cublaslt_bf16_tn", "when": {"var": var, "min": lo, "max": min(hi, top)}}
        if algo is not None:
            launch["algo"] = dict(zip(_FIELDS, algo, strict=True))
        out.append(launch)
    return out


def _check_runs(name: str, table: Mapping[tuple[int, int], tuple[Run, ...]]) -> None:
    for (n, k), runs in table.items():
        starts = [lo for lo, _ in runs]
        if not runs or starts[0] != 1 or starts != sorted(set(starts)):
            raise GenError(f"gemm algo table {name!r}: the runs of {n}x{k} must start at m 1 and ascend, got {starts}")


@dataclass(frozen=True, slots=True)
class GemmAlgos:
    """Pins the GEMMs whose m is a var to a table's algos by m range (see the module doc)."""

    table: str = "h200"
    name: str = "gemm-algos"
    runs: Mapping[tuple[int, int], tuple[Run, ...]] = field(init=False)

    def __post_init__(self) -> None:
        if self.table not in GEMM_ALGO_TABLES:
            raise GenError(f"no gemm algo table {self.table!r}; tables: {', '.join(sorted(GEMM_ALGO_TABLES))}")
        runs = GEMM_ALGO_TABLES[self.table]
        _check_runs(self.table, runs)
        object.__setattr__(self, "runs", runs)

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """No kernel entries: cuBLASLt's."""
        return ()

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Gives each (n, k, m var) GEMM call of the table its pinned op (in place)."""
        ops: dict[str, Any] = manifest["ops"]
        tops = {"tokens": ctx.plan.chunk, **({"rows": ctx.plan.rows} if ctx.plan.rows else {})}
        for program in manifest["programs"].values():
            for c in program["calls"]:
                if c["op"] != "gemm":
                    continue
                m, n, k = c["args"][3], _literal(c["args"][4]), _literal(c["args"][5])
                var = m.get("var") if set(m) == {"var"} else None
                if var not in tops or n is None or k is None or (n, k) not in self.runs:
                    continue
                op = f"gemm_{n}x{k}_{var}"
                if op not in ops:
                    ops[op] = {"params": ops["gemm"]["params"],
                               "impl": {"launches": _launches(self.runs[(n, k)], var, tops[var])}}
                c["op"] = op
