"""`kern.toml`: named targets and run defaults, so plain `kern-run` works.

    target = "qwen3-4b"          # the default target (else the first one declared)
    gpu = 0
    capacity = 4096              # KV tokens
    [targets.qwen3-4b]
    manifest = "examples/qwen3-4b.json"
    kernels = "kernels"
    weights = ["weights/Qwen3-4B"]   # optional: a seeded random checkpoint is written when absent
    tokenizer = "qwen2.5-72b-instruct"
    [kernels]
    sources = "tools/kernels-src"
    [run]
    prompt = "The capital of France is"
    steps = 32
    chunk = 2048
    [bench]
    peer = "auto"                # kern bench's compiled PyTorch peer: auto, on or off
    out = "out/kern-bench"       # where kern bench writes its JSON, table and plot
    [serve]
    target = "qwen3-4b-batch"    # kern serve's and kern bench serve's target (else the default)
    [test]
    seed = 0x5eed                # kern test's workload: same seed, same workload
    runs = 16                    # sequences in the workload
    decode_steps = 16            # the most teacher-forced decode steps of a run
    logit_kl = 0.01              # nats: a row above carries evidence, an argmax flip on it fails
    iters = 20                   # step replays the graph TPOT is the median of

Relative paths resolve against the file's directory and `~` expands. The nearest `kern.toml` in the
working directory or above is used unless `--config` names one. Precedence: flag, toml, default.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kern_manifest import name_list, short

__all__ = [
    "CONFIG_NAME",
    "PEER_MODES",
    "AbTestDefaults",
    "BenchDefaults",
    "KernConfig",
    "KernTomlError",
    "RunDefaults",
    "ServeDefaults",
    "Target",
    "config_for",
    "find_config",
    "load_config",
]

CONFIG_NAME = "kern.toml"

_TOP = {"target", "gpu", "capacity", "targets", "kernels", "run", "bench", "serve", "test"}
_TARGET = {"manifest", "kernels", "weights", "tokenizer"}
_RUN = {"prompt", "steps", "chunk"}
_KERNELS = {"sources"}
_BENCH = {"peer", "out"}
_SERVE = {"target"}
_TEST = {"seed", "runs", "decode_steps", "logit_kl", "iters"}
PEER_MODES = ("auto", "on", "off")


class KernTomlError(Exception):
    """kern.toml is unreadable, names an unknown key or target, or holds a wrongly typed value."""


@dataclass(frozen=True, slots=True)
class Target:
    """One named model: manifest, kernels dir, weights and tokenizer (paths resolved)."""

    name: str
    manifest: Path | None = None
    kernels: Path | None = None
    weights: tuple[Path, ...] = ()
    tokenizer: str | None = None


@dataclass(frozen=True, slots=True)
class RunDefaults:
    """`[run]`: prompt, steps and chunk when no flag gives them."""

    prompt: str | None = None
    steps: int | None = None
    chunk: int | None = None


@dataclass(frozen=True, slots=True)
class BenchDefaults:
    """`[bench]`: kern bench's peer mode and output directory when no flag gives them."""

    peer: str | None = None
    out: Path | None = None


@dataclass(frozen=True, slots=True)
class ServeDefaults:
    """`[serve]`: the target `kern serve` and `kern bench serve` use when none is named."""

    target: str | None = None


@dataclass(frozen=True, slots=True)
class AbTestDefaults:
    """`[test]`: kern test's workload, evidence threshold and timing when no flag gives them."""

    seed: int | None = None
    runs: int | None = None
    decode_steps: int | None = None
    logit_kl: float | None = None
    iters: int | None = None


@dataclass(frozen=True, slots=True)
class KernConfig:
    """A parsed kern.toml (or the empty config when there is none)."""

    path: Path | None = None
    default_target: str | None = None
    gpu: int | None = None
    capacity: int | None = None
    targets: Mapping[str, Target] = field(default_factory=dict[str, Target])
    kernel_sources: Path | None = None
    run: RunDefaults = field(default_factory=RunDefaults)
    bench: BenchDefaults = field(default_factory=BenchDefaults)
    serve: ServeDefaults = field(default_factory=ServeDefaults)
    test: AbTestDefaults = field(default_factory=AbTestDefaults)

    def target(self, name: str | None) -> Target | None:
        """The named target, else the default one; None when the file declares no target.

        Raises:
            KernTomlError: `name` is not declared.
        """
        chosen = name or self.default_target
        if chosen is None:
            return None
        if chosen not in self.targets:
            known = name_list(self.targets) or "none"
            where = self.path or CONFIG_NAME
            raise KernTomlError(f"{where}: no target {short(chosen)!r} (declared: {known})")
        return self.targets[chosen]


def find_config(start: Path) -> Path | None:
    """The nearest kern.toml in `start` or a parent directory."""
    for d in (start.resolve(), *start.resolve().parents):
        if (d / CONFIG_NAME).is_file():
            return d / CONFIG_NAME
    return None


def _unknown(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise KernTomlError(f"{where}: unknown key(s) {name_list(extra)} (allowed: {', '.join(sorted(allowed))})")


def _typed(where: str, table: Mapping[str, Any], key: str, kind: type) -> Any:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise KernTomlError(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    if kind is int and value < 0:
        raise KernTomlError(f"{where}: {key} must not be negative, got {value}")
    return value


def _test_defaults(where: str, raw: Mapping[str, Any]) -> AbTestDefaults:
    here = f"{where}: [test]"
    test = _table(here, raw.get("test", {}))
    _unknown(here, test, _TEST)
    kl = test.get("logit_kl")
    if kl is not None and (isinstance(kl, bool) or not isinstance(kl, int | float) or not kl > 0):
        raise KernTomlError(f"{here}: logit_kl must be a positive number, got {kl!r}")
    return AbTestDefaults(seed=_typed(here, test, "seed", int), runs=_typed(here, test, "runs", int),
                          decode_steps=_typed(here, test, "decode_steps", int),
                          logit_kl=None if kl is None else float(kl), iters=_typed(here, test, "iters", int))


def _table(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise KernTomlError(f"{where} must be a table")
    return value


class _Resolver:
    def __init__(self, base: Path) -> None:
        self.base = base

    def path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.base / p


def _target(name: str, raw: Any, res: _Resolver, where: str) -> Target:
    t = _table(f"{where}: [targets.{name}]", raw)
    here = f"{where}: [targets.{name}]"
    _unknown(here, t, _TARGET)
    weights = t.get("weights", [])
    if isinstance(weights, str):
        weights = [weights]
    if not isinstance(weights, list) or not all(isinstance(w, str) for w in weights):
        raise KernTomlError(f"{here}: weights must be a path or a list of paths")
    return Target(
        name=name,
        manifest=res.path(_typed(here, t, "manifest", str)),
        kernels=res.path(_typed(here, t, "kernels", str)),
        weights=tuple(p for w in weights if (p := res.path(w)) is not None),
        tokenizer=_typed(here, t, "tokenizer", str),
    )


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML table of `path`.

    Raises:
        KernTomlError: unreadable, not UTF-8, not TOML, or a number past Python's digit limit.
    """
    try:
        text = path.read_bytes().decode("utf-8")
        return tomllib.loads(text)
    except OSError as exc:
        raise KernTomlError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise KernTomlError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise KernTomlError(f"{path}: {exc}") from exc
    except ValueError as exc:
        # NOTE: tomllib's one other ValueError: an integer past sys.get_int_max_str_digits() digits
        raise KernTomlError(f"{path}: a number too long") from exc


def load_config(path: Path) -> KernConfig:
    """Parse one kern.toml.

    Raises:
        KernTomlError: unreadable file, TOML syntax, unknown keys or wrong types.
    """
    raw = _read_toml(path)
    where = str(path)
    _unknown(where, raw, _TOP)
    res = _Resolver(path.resolve().parent)
    targets = {n: _target(n, t, res, where) for n, t in _table(f"{where}: [targets]", raw.get("targets", {})).items()}
    run = _table(f"{where}: [run]", raw.get("run", {}))
    _unknown(f"{where}: [run]", run, _RUN)
    kernels = _table(f"{where}: [kernels]", raw.get("kernels", {}))
    _unknown(f"{where}: [kernels]", kernels, _KERNELS)
    default = _typed(where, raw, "target", str) or next(iter(targets), None)
    bench = _table(f"{where}: [bench]", raw.get("bench", {}))
    _unknown(f"{where}: [bench]", bench, _BENCH)
    peer = _typed(f"{where}: [bench]", bench, "peer", str)
    if peer is not None and peer not in PEER_MODES:
        raise KernTomlError(f"{where}: [bench]: peer must be one of {', '.join(PEER_MODES)}, got {peer!r}")
    serve = _table(f"{where}: [serve]", raw.get("serve", {}))
    _unknown(f"{where}: [serve]", serve, _SERVE)
    config = KernConfig(
        path=path,
        default_target=default,
        gpu=_typed(where, raw, "gpu", int),
        capacity=_typed(where, raw, "capacity", int),
        targets=targets,
        kernel_sources=res.path(_typed(f"{where}: [kernels]", kernels, "sources", str)),
        run=RunDefaults(
            prompt=_typed(f"{where}: [run]", run, "prompt", str),
            steps=_typed(f"{where}: [run]", run, "steps", int),
            chunk=_typed(f"{where}: [run]", run, "chunk", int),
        ),
        bench=BenchDefaults(peer=peer, out=res.path(_typed(f"{where}: [bench]", bench, "out", str))),
        serve=ServeDefaults(target=_typed(f"{where}: [serve]", serve, "target", str)),
        test=_test_defaults(where, raw),
    )
    config.target(default)
    if config.serve.target is not None:
        config.target(config.serve.target)
    return config


def config_for(explicit: Path | None, start: Path) -> KernConfig:
    """The kern.toml a command uses: `explicit` (a `--config` flag) if given, else the nearest one
    from `start` upward, else the empty config.

    Raises:
        KernTomlError: `explicit` is not a file, or the file is malformed.
    """
    if explicit is not None:
        if not explicit.is_file():
            raise KernTomlError(f"--config {explicit}: no such file")
        return load_config(explicit)
    found = find_config(start)
    return load_config(found) if found else KernConfig()
