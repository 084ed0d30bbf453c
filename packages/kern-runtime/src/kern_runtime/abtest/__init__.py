"""`kern test`'s library: does candidate manifest B compute what reference manifest A computes,
and how fast? (docs/test.md)

- `options`: `AbOptions` and their checks (`AbTestError` for bad input);
- `pair`: the two manifests' `Facts`, checked against each other (`check_pair`);
- `workload`: the runs, a pure function of the seed, both manifests' serving roles and the options;
- `drive`: one run on one `Side` (the slice of `Runtime` that a row uses, states zeroed and
  read);
- `rows`: one batch on one `Side`, through the batched decode step;
- `compare`: per-row statistics of the logits, the byte comparisons of outputs and states;
- `ladder`: the verdict ladder (`judge`), first match wins;
- `perf`: the timing section;
- `harness`: the stages (`ab_test`) over a `Loader` of the two sides;
- `device`: the GPU sides (`GpuLoader`, `RuntimeSide`);
- `report`: one fact per line, the verdict last, or JSON.

No module here imports torch; the CPU side is `kern_interp.side`.
"""

from ..inputs import widen
from .compare import (
    BLOCK_BYTES,
    NOISE_KL_FACTOR,
    TOP_K,
    RowStats,
    bits_equal,
    off_top,
    out_of_domain,
    outside_bytes,
    row_stats,
    values_equal,
    within_noise,
    written_blocks,
)
from .device import GpuLoader, RuntimeSide
from .drive import Record, Side, drive
from .harness import Loader, Result, StateCheck, ab_test
from .ladder import Evidence, Outcome, Verdict, judge
from .options import (
    DEFAULT_CAPACITY,
    DEFAULT_DECODE_STEPS,
    DEFAULT_ITERS,
    DEFAULT_LOGIT_KL,
    DEFAULT_RUNS,
    DEFAULT_SEED,
    AbOptions,
    AbTestError,
    check_options,
)
from .pair import Facts, Pair, check_pair, read_facts
from .perf import Timing, time_side
from .report import Report, report_of
from .rows import batch_pages, drive_batch
from .workload import Batch, Run, draw_batches, draw_workload, noise_chunk, token_top

__all__ = [
    "BLOCK_BYTES",
    "DEFAULT_CAPACITY",
    "DEFAULT_DECODE_STEPS",
    "DEFAULT_ITERS",
    "DEFAULT_LOGIT_KL",
    "DEFAULT_RUNS",
    "DEFAULT_SEED",
    "NOISE_KL_FACTOR",
    "TOP_K",
    "AbOptions",
    "AbTestError",
    "Batch",
    "Evidence",
    "Facts",
    "GpuLoader",
    "Loader",
    "Outcome",
    "Pair",
    "Record",
    "Report",
    "Result",
    "RowStats",
    "Run",
    "RuntimeSide",
    "Side",
    "StateCheck",
    "Timing",
    "Verdict",
    "ab_test",
    "batch_pages",
    "bits_equal",
    "check_options",
    "check_pair",
    "draw_batches",
    "draw_workload",
    "drive",
    "drive_batch",
    "judge",
    "noise_chunk",
    "off_top",
    "out_of_domain",
    "outside_bytes",
    "read_facts",
    "report_of",
    "row_stats",
    "time_side",
    "token_top",
    "values_equal",
    "widen",
    "within_noise",
    "written_blocks",
]
