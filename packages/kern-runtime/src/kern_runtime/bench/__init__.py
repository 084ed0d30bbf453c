"""`kern bench`'s library: what `kern bench` and `kern bench serve` measure, their floors, the
compiled PyTorch peer (run as its own process) and the report, for the command line, tools/gpu and
bench/ alike. No module here imports torch.

- `options`: `BenchOptions`, checked (`check_bench_options`), and the capacity they need;
- `floors`: the weight and KV bytes a step reads, the GEMM-only manifest of a step's GEMMs;
- `measure`: the loops on the GPU (decode, prefill, the per-call breakdown, the GEMM floor, the
  yardsticks);
- `timings`: `bench_session`, one manifest's timings on one GPU;
- `peer`: whether the peer runs, its command line, its checked result;
- `report`: rows, floors, the tables, the JSON and the plot;
- `serve`: `measure_levels`, serving throughput and latency in process;
- `serve_peer`: the serving peer (transformers' continuous batching, its own process) beside it.
"""

from .floors import (
    decode_weight_bytes,
    extern_calls,
    find_floor_manifest,
    floor_manifest,
    gemm_only_manifest,
    kv_bytes_per_token,
    step_program,
)
from .options import (
    BREAKDOWN_RUNS,
    DEFAULT_BENCH_CHUNK,
    DEFAULT_BENCH_STEPS,
    DEFAULT_CONTEXTS,
    DEFAULT_PREFILL,
    MIN_STEPS,
    PROMPT_VOCAB,
    BenchError,
    BenchOptions,
    bench_capacity,
    check_bench_options,
)
from .peer import (
    PEER_MODES,
    PEER_MODULE,
    PEER_TIMEOUT_S,
    PeerError,
    PeerPlan,
    check_result,
    measure_peer,
    peer_command,
    plan_peer,
    run_peer,
)
from .report import (
    BREAKDOWN_COLUMNS,
    CallTime,
    Report,
    Row,
    breakdown_markdown,
    breakdown_table,
    call_kinds,
    checkpoint_config,
    compute_floor_rows,
    context_of,
    decode_series,
    floor_rows,
    peer_rows,
    plot,
    row,
    table,
    write_report,
)
from .serve import (
    WARM_TOKENS,
    Level,
    levels_table,
    measure_levels,
    one_row,
    percentile,
    warm_rows,
)
from .serve_peer import (
    SERVE_PEER_MODULE,
    SERVE_PEER_TIMEOUT_S,
    ServeWorkload,
    check_serve_result,
    checkpoint_dir,
    plan_serve_peer,
    run_serve_peer,
    serve_peer_command,
    side_by_side,
)
from .timings import (
    bench_session,
)

__all__ = [
    "BREAKDOWN_COLUMNS",
    "BREAKDOWN_RUNS",
    "DEFAULT_BENCH_CHUNK",
    "DEFAULT_BENCH_STEPS",
    "DEFAULT_CONTEXTS",
    "DEFAULT_PREFILL",
    "MIN_STEPS",
    "PEER_MODES",
    "PEER_MODULE",
    "PEER_TIMEOUT_S",
    "PROMPT_VOCAB",
    "SERVE_PEER_MODULE",
    "SERVE_PEER_TIMEOUT_S",
    "WARM_TOKENS",
    "BenchError",
    "BenchOptions",
    "CallTime",
    "Level",
    "PeerError",
    "PeerPlan",
    "Report",
    "Row",
    "ServeWorkload",
    "bench_capacity",
    "bench_session",
    "breakdown_markdown",
    "breakdown_table",
    "call_kinds",
    "check_bench_options",
    "check_result",
    "check_serve_result",
    "checkpoint_config",
    "checkpoint_dir",
    "compute_floor_rows",
    "context_of",
    "decode_series",
    "decode_weight_bytes",
    "extern_calls",
    "find_floor_manifest",
    "floor_manifest",
    "floor_rows",
    "gemm_only_manifest",
    "kv_bytes_per_token",
    "levels_table",
    "measure_levels",
    "measure_peer",
    "one_row",
    "peer_command",
    "peer_rows",
    "percentile",
    "plan_peer",
    "plan_serve_peer",
    "plot",
    "row",
    "run_peer",
    "run_serve_peer",
    "serve_peer_command",
    "side_by_side",
    "step_program",
    "table",
    "warm_rows",
    "write_report",
]
