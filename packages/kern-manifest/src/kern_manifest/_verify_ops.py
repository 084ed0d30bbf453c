"""Verifier checks of ops: launches, args, packs, tensormaps and impl dataflow."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kern_manifest._verify_base import (
    ALGO_EXTERNS,
    CUDA_LIMITS,
    Base,
    OpInfo,
    names,
    ptr,
)
from kern_manifest._verify_fp8 import Fp8Checks
from kern_manifest._verify_packs import Key, LaunchAccess, PackChecks
from kern_manifest.errors import (
    escape_pointer,
    short,
    short_pointer,
)
from kern_manifest.schema import (
    ExternLaunch,
    KernelLaunch,
    LaunchArg,
    Op,
    PackArg,
    ParamArg,
    ParamType,
    RankArg,
    ScratchArg,
)

__all__ = ["ImplFlow", "Key", "LaunchAccess", "OpChecks"]


class ImplFlow:
    """Launch-order dataflow inside one impl: scratch written before read, out params written."""

    def __init__(self, op: Op) -> None:
        self.op = op
        self.written: set[Key] = set()
        self.touched: set[Key] = set()
        self.early_reads: list[tuple[str, int]] = []
        self.index = 0

    def step(self) -> LaunchAccess:
        return LaunchAccess()

    def commit(self, step: LaunchAccess) -> None:
        for key in sorted(step.reads, key=str):
            if key[0] == "scratch" and key not in self.written:
                self.early_reads.append((str(key[1]), self.index))
        self.written |= step.writes
        self.touched |= step.reads | step.writes
        self.index += 1

    def finish(self, v: Base, at: str) -> None:
        for name, j in self.early_reads:
            v.err(
                f"{at}/impl/launches/{j}",
                f"reads scratch {short(name)!r} before any launch writes it",
                "write scratch in an earlier launch",
            )
        for i, p in enumerate(self.op.params):
            if p.direction == "out" and ("param", i) not in self.written:
                v.err(
                    f"{at}/params/{i}",
                    f"out param {i} is never written by a launch",
                    "write it in some launch, or declare it in",
                )
        for name in self.op.impl.scratch:
            if ("scratch", name) not in self.touched:
                v.err(
                    f"{at}/impl/scratch/{escape_pointer(name)}",
                    f"unused scratch {short(name)!r}",
                    "remove it or pass it to a launch",
                )


class OpChecks(PackChecks, Fp8Checks):
    """Ops and their launches."""

    def op(self, name: str, op: Op) -> None:
        at = ptr("ops", name)
        info = OpInfo(op.params)
        self.ops[name] = info
        for i, p in enumerate(op.params):
            if p.kind == "bytes":
                self.err(
                    f"{at}/params/{i}",
                    "bytes<n> in an op interface",
                    "bytes<n> params are launch-private: fill them with a pack",
                )
        scratch_sizes: dict[str, int] = {}
        for sname, sc in op.impl.scratch.items():
            size = self.shape(
                sc.shape, sc.dtype, f"{at}/impl/scratch/{escape_pointer(sname)}/shape"
            )
            scratch_sizes[sname] = size or 0
        if not op.impl.launches:
            self.err(
                at + "/impl/launches", "op with no launches", "give the impl at least one launch"
            )
        flow = ImplFlow(op)
        for j, launch in enumerate(op.impl.launches):
            lat = f"{at}/impl/launches/{j}"
            if isinstance(launch, KernelLaunch):
                self.kernel(launch, lat)
            else:
                info.has_extern = True
                info.collective |= launch.signature.collective
                self.extern(launch, lat)
                self.fp8_launch(op, launch, lat, info, self.launch_bounds_quiet(launch))
            self.launch_args(op, launch, lat, flow, info)
        flow.finish(self, at)

    def launch_bounds(
        self, launch: KernelLaunch | ExternLaunch, at: str
    ) -> dict[str, tuple[int, int]]:
        when = launch.when
        if when is None or not self.var_ref(when.var, at + "/when/var"):
            return self.bounds
        if self.followed(("var", when.var)):
            return self.bounds
        top = self.vmax[when.var]
        lo = 1 if when.min is None else when.min
        hi = top if when.max is None else when.max
        if lo > hi or lo > top or hi < 1:
            self.err(
                at + "/when",
                f"when range [{lo}, {hi}] is empty within {when.var} in [1, {top}]",
                "use 1 <= min <= max <= the var's max",
            )
            return self.bounds
        return {**self.bounds, when.var: (max(lo, 1), min(hi, top))}

    def kernel(self, launch: KernelLaunch, at: str) -> None:
        self.use.modules.add(launch.module)
        if launch.module not in self.m.modules:
            self.err(
                at + "/module",
                f"unknown module {short(launch.module)!r}",
                f"declare it under /modules (declared: {names(self.m.modules)})",
            )
        self.block(launch.block, at + "/block")
        bounds = self.launch_bounds(launch, at)
        limits = (CUDA_LIMITS.grid_x, CUDA_LIMITS.grid_yz, CUDA_LIMITS.grid_yz)
        for i, (dim, limit) in enumerate(zip(launch.grid, limits, strict=True)):
            span = self.range(dim, f"{at}/grid/{i}", bounds)
            if span is None:
                continue
            if span[0] < 1:
                self.err(
                    f"{at}/grid/{i}",
                    f"grid dim can be {span[0]}",
                    "grids must be >= 1 at the vars' minimum",
                )
            if span[1] > limit:
                self.err(
                    f"{at}/grid/{i}",
                    f"grid dim reaches {span[1]} > {limit}",
                    "stay within CUDA's grid limits at the vars' maximum",
                )
        smem = self.range(launch.shared_mem, at + "/shared_mem", bounds)
        if smem is not None and smem[1] > CUDA_LIMITS.shared_mem:
            self.err(
                at + "/shared_mem",
                f"dynamic shared memory reaches {smem[1]} bytes",
                f"sm_90 allows at most {CUDA_LIMITS.shared_mem} bytes (opt-in)",
            )
        if launch.cluster is not None:
            self.cluster(launch, at)
        if launch.carveout is not None:
            self.carveout(launch, launch.carveout, at + "/carveout")

    def block(self, block: tuple[int, int, int], at: str) -> None:
        x, y, z = block
        if (
            min(block) < 1
            or x > CUDA_LIMITS.block_xy
            or y > CUDA_LIMITS.block_xy
            or z > CUDA_LIMITS.block_z
        ):
            self.err(
                at,
                f"block {list(block)} outside CUDA limits",
                "each dim >= 1; x, y <= 1024; z <= 64",
            )
        elif x * y * z > CUDA_LIMITS.block_threads:
            self.err(at, f"block of {x * y * z} threads", "a block has at most 1024 threads")

    def cluster(self, launch: KernelLaunch, at: str) -> None:
        cluster = launch.cluster or (1, 1, 1)
        if min(cluster) < 1 or math.prod(cluster) > CUDA_LIMITS.cluster_blocks:
            self.err(
                at + "/cluster",
                f"cluster {list(cluster)} outside limits",
                "each dim >= 1, at most 16 blocks in all",
            )
            return
        for i, (dim, c) in enumerate(zip(launch.grid, cluster, strict=True)):
            if c > 1 and (dim.divisor == 0 or dim.divisor % c):
                self.err(
                    f"{at}/grid/{i}",
                    f"grid dim is not always a multiple of cluster {c}",
                    "make the grid dim a multiple of the cluster dim",
                )

    def carveout(self, launch: KernelLaunch, pct: int, at: str) -> None:
        """A function attribute, so every launch of one entry asks for the same carveout."""
        if not 0 <= pct <= 100:
            self.err(at, f"carveout {pct}", "give the preferred shared-memory share in percent, 0..100")
            return
        key = (launch.module, launch.entry)
        first = self.carveouts.setdefault(key, (pct, at))
        if first[0] != pct:
            self.err(
                at,
                f"carveout {pct} for {short(launch.module)}/{short(launch.entry)}, {first[0]} at {short_pointer(first[1])}",
                "the carveout is a function attribute: give every launch of the entry the same",
            )

    def extern(self, launch: ExternLaunch, at: str) -> None:
        self.launch_bounds(launch, at)
        if launch.algo is not None and launch.entry not in ALGO_EXTERNS:
            self.err(at + "/algo", f"algo on {launch.entry}", "algo pins cublasLt bf16 GEMMs only")
        if launch.signature.collective:
            args = launch.args or ()
            if not args or not isinstance(args[-1], RankArg):
                self.err(
                    at + "/args",
                    f'{launch.entry} needs {{"rank": group}} as its last arg',
                    'wire [send, recv, count, {"rank": g}]',
                )

    def launch_params(
        self, op: Op, launch: KernelLaunch | ExternLaunch, at: str
    ) -> tuple[ParamType, ...] | None:
        if isinstance(launch, KernelLaunch):
            return launch.params if launch.params is not None else op.params
        sig = launch.signature
        n = len(launch.args) if launch.args is not None else len(op.params)
        if not len(sig.required) <= n <= len(sig.required) + len(sig.optional):
            want = f"{len(sig.required)}" + (
                f"..{len(sig.required) + len(sig.optional)}" if sig.optional else ""
            )
            self.err(
                at + ("/args" if launch.args is not None else ""),
                f"{launch.entry} takes {want} args, got {n}",
                "see docs/manifest.md, extern launches",
            )
            return None
        return (sig.required + sig.optional)[:n]

    def launch_args(
        self, op: Op, launch: KernelLaunch | ExternLaunch, at: str, flow: ImplFlow, info: OpInfo
    ) -> None:
        params = self.launch_params(op, launch, at)
        if params is None:
            return
        abi = sum(p.size for p in params)
        if abi > CUDA_LIMITS.param_bytes:
            self.err(
                at + ("/params" if isinstance(launch, KernelLaunch) and launch.params else ""),
                f"kernel params take {abi} bytes",
                f"CUDA allows {CUDA_LIMITS.param_bytes}; pass large data through a buffer",
            )
        args: Sequence[LaunchArg] = (
            launch.args
            if launch.args is not None
            else [ParamArg(param=i) for i in range(len(op.params))]
        )
        if len(args) != len(params):
            where = at + "/args" if launch.args is not None else at
            self.err(
                where, f"{len(args)} args for {len(params)} params", "pass one arg per launch param"
            )
            return
        bounds = self.launch_bounds_quiet(launch)
        step = flow.step()
        for k, (arg, param) in enumerate(zip(args, params, strict=True)):
            self.launch_arg(op, arg, param, f"{at}/args/{k}", bounds, step, info)
        flow.commit(step)

    def launch_bounds_quiet(
        self, launch: KernelLaunch | ExternLaunch
    ) -> Mapping[str, tuple[int, int]]:
        when = launch.when
        if when is None or when.var not in self.vmax:
            return self.bounds
        top = self.vmax[when.var]
        lo = max(1, when.min or 1)
        hi = min(top, when.max if when.max is not None else top)
        return {**self.bounds, when.var: (lo, hi)} if lo <= hi else self.bounds

    def launch_arg(
        self,
        op: Op,
        arg: LaunchArg,
        param: ParamType,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
        step: LaunchAccess,
        info: OpInfo,
    ) -> None:
        if isinstance(arg, ParamArg):
            self.forward(op, arg.param, param, at, step)
        elif isinstance(arg, ScratchArg):
            self.scratch_arg(op, arg.scratch, param, at, step)
        elif isinstance(arg, PackArg):
            self.pack(op, arg.pack, param, at, bounds, step, info)
        else:
            self.scalar_arg(arg, param, at, bounds)

    def forward(self, op: Op, index: int, param: ParamType, at: str, step: LaunchAccess) -> None:
        if index >= len(op.params):
            self.err(
                at + "/param",
                f"param {index} out of range",
                f"the op has {len(op.params)} params (0..{len(op.params) - 1})",
            )
            return
        iface = op.params[index]
        if iface.kind != param.kind or iface.dtype != param.dtype:
            self.err(
                at,
                f"forwards `{iface}` into a `{param}` slot",
                "forward a param of the same kind and dtype",
            )
            return
        if param.writes and not iface.writes:
            self.err(
                at,
                f"writes through in param {index}",
                f"declare param {index} out or inout, or pass it to an in slot",
            )
        if iface.is_pointer:
            step.touch(("param", index), param.reads, param.writes)

    def scratch_arg(self, op: Op, name: str, param: ParamType, at: str, step: LaunchAccess) -> None:
        sc = op.impl.scratch.get(name)
        if sc is None:
            self.err(
                at + "/scratch",
                f"unknown scratch {short(name)!r}",
                f"declare it under impl/scratch (declared: {names(op.impl.scratch)})",
            )
            return
        if param.kind != "buffer" or param.dtype != sc.dtype:
            self.err(
                at,
                f"scratch {short(name)!r} of {sc.dtype} into a `{param}` slot",
                f"the slot must be a buffer<{sc.dtype}>",
            )
            return
        step.touch(("scratch", name), param.reads, param.writes)
