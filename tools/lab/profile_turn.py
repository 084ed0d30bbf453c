"""Where the host's time goes in a warm turn on the local GPU: a `--context`-token conversation
kept in the engine's index, then `--turns` new `--turn`-token turns over it on the head path
(`Engine.prefill(first=True)`, as bench_engine's warm row), each released after its first token,
run under cProfile after two unprofiled ones.

    PYTHONPATH=tools/tests:tools/gpu python3 tools/lab/profile_turn.py DIR [--context 14000] [--turn 200]
        [--turns 10] [--chunk-graphs 32] [--manifest examples/qwen3-4b-fast.json] [--gpu 0]

Prints (and writes DIR/profile_turn.txt) each profiled turn's wall time and the 40 functions with
the most cumulative time; the time the host waits for the GPU shows as the synchronizing
calls (`read_output`, `synchronize`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import numpy as np
from engine_inputs import add_engine_args, load_inputs


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_engine_args(ap, "qwen3-4b-fast")
    ap.add_argument("--context", type=int, default=14000)
    ap.add_argument("--turn", type=int, default=200)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--chunk-graphs", type=int, default=32,
                    help="EngineConfig.chunk_graphs (0: every chunk enqueued call by call)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import kern_runtime as kr

    def log(msg: str) -> None:
        print(f"profile_turn: {msg}", file=sys.stderr, flush=True)

    manifest, files = load_inputs(args, log)
    roles = kr.serving_roles(manifest)
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, 150000, size=n)]

    out: list[str] = []
    with kr.Engine.open(args.manifest, args.kernels, files, gpu=args.gpu, tokens=2 * (args.context + args.turn) + 1024,
                        config=kr.EngineConfig(chunk=2048, chunk_graphs=args.chunk_graphs), log=log,
                        roles=roles) as eng:
        base = eng.sequence()
        eng.turn(base, ids(args.context), 1)
        conv = list(base.tokens)

        def turn() -> float:
            seq = eng.sequence()
            eng.backend.synchronize()
            t0 = time.perf_counter()
            pre = eng.prefill(seq, [*conv, *ids(args.turn)], 1, first=True)
            ms = (time.perf_counter() - t0) * 1e3
            assert pre.first is not None and pre.source.value == "resident", pre
            eng.release(seq)
            return ms

        for _ in range(2):
            turn()
        prof = cProfile.Profile()
        prof.enable()
        times = [turn() for _ in range(args.turns)]
        prof.disable()
    out.append("turns (ms, under cProfile): " + " ".join(f"{t:.2f}" for t in times))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
    out.append(buf.getvalue())
    text = "\n".join(out)
    print(text)
    (args.out / "profile_turn.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
