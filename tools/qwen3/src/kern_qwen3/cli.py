"""`kern-qwen3`: any Qwen3 `config.json` + our kernels -> a verified kern manifest.

    kern-qwen3 (CONFIG.json | --preset qwen3-4b|qwen3-tiny) -o OUT.json [--model NAME]
        [--kernels-src tools/kernels-src] [--kernels kernels] [--chunk 2048] [--feed device|host]
        [--precision bf16|f32] [--weights bf16|qwen-fp8] [--gemv GEMMS] [--fuse] [--fold-norm --defer-norm]
        [--pdl] [--gemm-algos h200] [--rows R]

builds the kernel sources into the kernels directory (cached by hash), finds which module defines
each entry, generates the manifest, checks it with kern_manifest's verifier and only then writes
it. Errors are one line `kern-qwen3: message` on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn, cast

from kern_manifest import ManifestError, load_manifest
from kern_qwen3.entries import DEVICE_FEED_ENTRIES, GEMV_DEFAULT, GEMV_GEMMS, entry_modules
from kern_qwen3.errors import ConfigError, GenError
from kern_qwen3.facts import decode_weight_bytes
from kern_qwen3.fp8 import WEIGHT_FORMATS
from kern_qwen3.fragments import Json
from kern_qwen3.gemm_algos import GEMM_ALGO_TABLES
from kern_qwen3.generate import generate
from kern_qwen3.passes import plan_passes
from kern_qwen3.plan import DEFAULT_CHUNK, FEEDS, PRECISIONS, Plan
from kern_qwen3.shape import PRESETS, preset, shape_from_config
from kern_qwen3.tp import generate_tp

__all__ = ["PROG", "against_capture", "build_and_hash", "captured_modules", "main", "read_config"]

PROG = "kern-qwen3"


class _Parser(argparse.ArgumentParser):
    """Flag errors as one `kern-qwen3: message (see kern-qwen3 --help)` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(2)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    p.add_argument("--version", action="version", version=f"{PROG} {version('kern-qwen3')}")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("config", type=Path, nargs="?", help="Hugging Face config.json of a Qwen3 model")
    src.add_argument("--preset", choices=sorted(PRESETS), help="a built-in config instead of a file")
    p.add_argument("-o", "--out", type=Path, required=True, help="manifest path to write")
    p.add_argument("--model", help="manifest model label (default: the output file's stem)")
    p.add_argument("--kernels-src", type=Path, default=Path("tools/kernels-src"),
                   help="directory of the kernel sources (default: tools/kernels-src)")
    p.add_argument("--kernels", type=Path, default=Path("kernels"), help="cubin output dir")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="largest prefill chunk")
    p.add_argument("--gemv", default="",
                   help=f"comma-separated decode GEMMs to run as our GEMV ({','.join(GEMV_GEMMS)}), "
                        f"'default' ({','.join(GEMV_DEFAULT)}) or 'all'; empty: all cublasLt")
    p.add_argument("--fuse", action="store_true",
                   help="q/k norm + rope writes the KV pages; decode attention in one launch")
    p.add_argument("--fold-norm", action="store_true",
                   help="the add + RMSNorm before qkv and gate_up inside those GEMVs (with --defer-norm)")
    p.add_argument("--defer-norm", action="store_true",
                   help="with --fold-norm: qkv and gate_up apply the norm's scale in their epilogue (gemv_defer.cu)")
    p.add_argument("--pdl", action="store_true",
                   help="programmatic dependent launch on every decode kernel (needs --gemv all)")
    p.add_argument("--gemm-algos", choices=sorted(GEMM_ALGO_TABLES), default=None,
                   help="pin cuBLASLt algos by m range for the prefill and batched-step GEMMs from this "
                        "measured table (kern_qwen3.gemm_algos; default: the heuristic's)")
    p.add_argument("--rows", type=int, default=None,
                   help="R >= 2: add the batched decode step over 1..R rows (one sequence per row, "
                        "GPU sampling; needs --feed device); the one-row step stays as it is")
    p.add_argument("--capture", type=Path, default=None,
                   help="a capture of the donor (tools/donor under kern-mine capture): pin the "
                        "cubins it ran (kern kernels --from DIR MANIFEST copies them); the "
                        "generator's constants must equal the mined ones, and the manifest is "
                        "checked against the mined entries, parameter tables, literals, grids and "
                        "wiring before it is written")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="f32: the reference-precision manifest (qwen3_f32.cu: float32 activations, "
                        "residual, logits and KV cache over the bf16 weights; no speed options)")
    p.add_argument("--weights", choices=WEIGHT_FORMATS, default="bf16",
                   help="qwen-fp8: bind a Qwen FP8 checkpoint (e4m3 linears with 128 x 128 block scales) as "
                        "downloaded; decode reads the e4m3 bytes (kern_qwen3.fp8, docs/qwen3.md)")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor parallel over N ranks (topology group tp): one SPMD manifest, weights "
                        "bound by rank (docs/qwen3.md)")
    p.add_argument("--feed", choices=FEEDS, default=None,
                   help="who writes the decode step's inputs (default: device when the kernel "
                        "sources define the copy and advance kernels, else host)")
    args = p.parse_args(argv)
    if args.rows is not None and args.rows < 2:
        p.error(f"--rows {args.rows}: the batched step needs R >= 2 (one row is the decode program itself)")
    return args


def read_config(path: Path) -> Mapping[str, Any]:
    """A config.json file as a JSON object.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, not JSON, or not a JSON object.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path} is not UTF-8 text (byte {exc.start})") from exc
    try:
        data: object = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ConfigError(f"config {path} is not JSON{where}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a JSON object, got a JSON {type(data).__name__}")
    return cast("dict[str, Any]", data)


def build_and_hash(src: Path, out: Path) -> dict[str, str]:
    """Build the kernels (cached by hash) and return module -> sha256."""
    from kern_mining.build import build_kernels

    return {module: sha for module, (_path, sha) in build_kernels(src, out).items()}


def captured_modules(capture: Path, entries: Mapping[str, str]) -> dict[str, str]:
    """module -> sha256 of the cubin the donor's capture ran for it (the pins `--capture` writes;
    `kern kernels --from CAPTURE MANIFEST` then copies those cubins out of the dump).

    Raises:
        GenError: the capture cannot be mined, or one module ran two different cubins.
    """
    from kern_mining import DumpError
    from kern_qwen3 import mined

    try:
        consts = mined.generator_constants(mined.mined_facts(capture))
    except (mined.MinedError, DumpError) as exc:
        raise GenError(f"capture {capture}: {exc}") from exc
    modules: dict[str, str] = {}
    for entry, sha in sorted(consts.entry_modules.items()):
        module = entries.get(entry)
        if module is not None and modules.setdefault(module, sha) != sha:
            raise GenError(f"capture {capture}: module {module} ran two cubins ({modules[module][:12]}, {sha[:12]})")
    return modules


def _plan(args: argparse.Namespace, entries: Mapping[str, str]) -> Plan:
    feed = args.feed or ("device" if all(e in entries for e in DEVICE_FEED_ENTRIES) else "host")
    named = {"default": GEMV_DEFAULT, "all": GEMV_GEMMS}
    gemv = named.get(args.gemv) or tuple(g for g in args.gemv.split(",") if g)
    passes = plan_passes(fold_norm=args.fold_norm, defer_norm=args.defer_norm, pdl=args.pdl,
                         gemm_algos=args.gemm_algos)
    return Plan(chunk=args.chunk, feed=feed, precision=args.precision, gemv=gemv, fuse=args.fuse, passes=passes,
                rows=args.rows or 0, weights=args.weights)


def _verified(manifest: Json) -> str:
    """The manifest's text, once kern_manifest's parser and verifier accept it.

    Raises:
        GenError: the verifier rejects it (its first problem).
    """
    text = json.dumps(manifest, indent=1) + "\n"
    try:
        load_manifest(text)
    except ManifestError as exc:
        raise GenError(f"the generated manifest does not verify: {exc.line()}") from exc
    return text


def _generate(args: argparse.Namespace) -> Json:
    from kern_mining.build import KernelBuildError

    cfg = preset(args.preset) if args.preset else read_config(args.config)
    shape = shape_from_config(cfg)
    entries = entry_modules(args.kernels_src)
    plan = _plan(args, entries)
    try:
        modules = (captured_modules(args.capture, entries) if args.capture is not None
                   else build_and_hash(args.kernels_src, args.kernels))
    except KernelBuildError as exc:
        raise GenError(str(exc)) from exc
    if args.tp is not None:
        if args.capture is not None:
            raise GenError("--tp manifests are not checked against a capture: drop --capture")
        return generate_tp(shape, modules, entries, model=args.model or args.out.stem, tp=args.tp, plan=plan)
    return generate(shape, modules, entries, model=args.model or args.out.stem, plan=plan)


def against_capture(manifest: Json, capture: Path) -> list[str]:
    from kern_mining import DumpError
    from kern_qwen3 import mined

    try:
        facts = mined.mined_facts(capture)
        consts = mined.generator_constants(facts)
    except (mined.MinedError, DumpError) as exc:
        return [str(exc)]
    return mined.constants_problems(consts) + list(mined.check_against(manifest, facts))


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit status (0, or 2 with one line on stderr)."""
    args = _parse(argv)
    try:
        manifest = _generate(args)
        text = _verified(manifest)
    except GenError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.capture is not None:
        problems = against_capture(manifest, args.capture)
        for line in problems:
            print(f"{PROG}: capture {args.capture}: {line}", file=sys.stderr)
        if problems:
            return 2
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    except OSError as exc:
        print(f"{PROG}: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    n_decode = len(manifest["programs"]["decode"]["calls"])
    head = manifest["programs"].get("head")
    n_head = f", head {len(head['calls'])} calls" if head is not None else ""
    print(f"{PROG}: wrote {args.out} ({len(manifest['buffers'])} buffers, decode {n_decode} calls{n_head}, "
          f"{decode_weight_bytes(manifest) / 1e9:.3f} GB of weights per decode step)", file=sys.stderr)
    return 0
