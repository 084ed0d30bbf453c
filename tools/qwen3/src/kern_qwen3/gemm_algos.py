"""cuBLASLt algorithms pinned by m range for the GEMMs whose m is a var (the prefill chunk's
`tokens`, the batched step's `rows`), and the pass that writes them (`GemmAlgos`).

cuBLASLt's heuristic ranks its candidates without running them, and its first choice is not the
fastest everywhere: on the H200, `tools/lab/sweep_gemm.py` (every candidate timed at both ends of
each m segment from 1 to 2,048, over weights rotated past L2) finds faster ones for every GEMM
below m 256 and for gate_up at the full chunk, 2,048, while from m 257 to 2,047 the heuristic's are
as fast as any (tools/lab/notes/kernel-experiments.md). A table lists, per (n, k), runs of m from
their first m to the next run's: a run pinned to one algo (its manifest `algo` fields), or left to
the heuristic (None); past the m measured it ends on a run left to the heuristic. The pass gives every such GEMM call its own op with one launch per
run (`when` on the call's m var; the runtime AlgoChecks each pin at both ends of its range), so
calls of other shapes keep the heuristic's `gemm` op. (A one-row step on cuBLASLt calls its GEMMs at
m = tokens = 1: the first run's pin.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
        (1, (66, 394, 1, 0, 0, 3, 35, 0, 7)), (9, (66, 16, 1, 0, 0, 3, 35, 0, 7)),
        (17, (66, 395, 1, 0, 0, 3, 35, 0, 7)), (49, (66, 26, 1, 0, 0, 1, 35, 0, 4)),
        (97, (66, 27, 1, 0, 0, 2, 35, 0, 5)), (129, None),
    ),
    (2560, 4096): (  # o
        (1, (66, 10, 1, 0, 0, 3, 35, 0, 7)), (9, (66, 15, 1, 0, 0, 1, 35, 0, 4)),
        (97, (66, 317, 1, 0, 0, 1, 35, 0, 4)), (129, (66, 26, 1, 0, 0, 1, 35, 0, 4)),
        (193, (66, 27, 1, 0, 0, 2, 35, 0, 9)), (257, None),
    ),
    (19456, 2560): (  # gate_up
        (1, (66, 196, 1, 0, 0, 0, 35, 0, 4)), (25, (66, 220, 1, 0, 0, 0, 35, 0, 4)),
        (65, (66, 200, 1, 0, 0, 0, 35, 0, 4)), (129, (66, 209, 1, 0, 0, 4, 35, 0, 4)), (193, None),
        (2048, (66, 184, 1, 0, 0, 2, 35, 0, 5)), (2049, None),
    ),
    (2560, 9728): (  # down
        (1, (66, 312, 3, 2, 0, 1, 35, 0, 4)), (17, (66, 394, 3, 2, 0, 3, 35, 0, 7)), (33, None),
        (129, (66, 317, 1, 0, 0, 1, 35, 0, 4)), (193, (66, 27, 1, 0, 0, 2, 35, 0, 9)), (257, None),
    ),
    (151936, 2560): (  # lm_head
        (1, (66, 394, 1, 0, 0, 1, 35, 0, 3)), (2, (66, 10, 1, 0, 0, 1, 35, 0, 3)),
        (9, (66, 312, 1, 0, 0, 1, 35, 0, 3)), (17, (66, 13, 1, 0, 0, 1, 35, 0, 4)),
        (33, (66, 453, 1, 0, 0, 1, 35, 0, 3)), (49, (66, 27, 1, 0, 0, 0, 35, 0, 3)), (65, None),
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

    def __post_init__(self) -> None:
        if self.table not in GEMM_ALGO_TABLES:
            raise GenError(f"no gemm algo table {self.table!r}; tables: {', '.join(sorted(GEMM_ALGO_TABLES))}")
        _check_runs(self.table, self.runs)

    @property
    def runs(self) -> Mapping[tuple[int, int], tuple[Run, ...]]:
        """The table's runs by (n, k)."""
        return GEMM_ALGO_TABLES[self.table]

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
