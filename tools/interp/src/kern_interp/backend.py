"""kern_runtime.Engine's backend on the host: the Qwen3 interpreter's programs over a kern_pool
Pool and Host, whose decisions (zeroed pages, page copies, park and wake copies) are executed on
the interpreter's KV array and a numpy host block, as kern_runtime.sequences executes them on the
GPU's arenas and pinned memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import kern_pool
import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.collectives import Collective
from kern_manifest import Manifest


class InterpBackend:
    """`kern_runtime.Backend` over `kern_interp.qwen3.Interp`: `pages` KV pages in chunks of
    `chunk_pages`, a host tier of `host_pages` pages (0: none); `manifest` is `read_manifest`'s
    model (or a generated manifest's plain JSON); `collective`: a tensor-parallel rank's
    (`kern_interp.collectives.Group.member`)."""

    def __init__(self, manifest: Manifest | Mapping[str, Any], tensors: Mapping[str, np.ndarray], *, pages: int = 64,
                 chunk_pages: int = 8, host_pages: int = 0, collective: Collective | None = None) -> None:
        model = interp.model_of(manifest)
        roles = kr.serving_roles(model)
        unit = roles.page_tokens
        bpt = interp.kv_token_bytes(model)
        config = kern_pool.PoolConfig((kern_pool.PagedState("kv", bpt),), (), unit, roles.blocks_len,
                                      chunk=chunk_pages * unit * bpt, chunks=pages // chunk_pages)
        self.pool, _ = kern_pool.Pool.create(config)  # NOTE: the initial plan counts as landed
        self.machine = interp.Interp(model, tensors, capacity=self.pool.pages_max * unit, collective=collective)
        self.page = unit * bpt // self.machine.kv_elem
        self._host = kern_pool.Host(self.pool, host_pages, 1, 1) if host_pages else None
        self.host_kv = np.zeros(host_pages * self.page, dtype=np.float32)
        self.calls: list[tuple[str, str]] = []
        self._flying: list[kern_pool.Parked] = []
        """What staged wakes' copies hold until they land: the runtime's transfer stream keeps a
        clone of the parked copy it reads until then, and lets it go when it next looks (a park,
        a synchronize); so does this backend."""

    # ---- programs ----------------------------------------------------------------------------

    def write_input(self, name: str, array: Any) -> None:
        self.machine.write_input(name, np.asarray(array))

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        self.calls.append(("run", program))
        self.machine.run(program, vars)

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        self.calls.append(("issue", program))
        self.machine.run(program, vars)

    def read_output(self, name: str, count: int | None = None) -> np.ndarray:
        out = self.machine.read_output(name)
        return out if count is None else out[:count]

    def fetch_output(self, name: str, count: int | None = None) -> np.ndarray:
        """The output as the stream has it now (the interpreter runs each call at once)."""
        self.calls.append(("fetch", name))
        return self.read_output(name, count).copy()

    def fetched(self, fetch: np.ndarray) -> np.ndarray:
        self.calls.append(("fetched", ""))
        return fetch

    def synchronize(self) -> None:
        self._land()

    def _land(self) -> None:
        for held in self._flying:
            held.release()
        self._flying.clear()

    # ---- sequences ---------------------------------------------------------------------------

    def _page(self, p: int) -> slice:
        return slice(p * self.page, (p + 1) * self.page)

    def _zero(self, pages: Any) -> None:
        for p in pages:
            self.machine.kv[self._page(p)] = 0

    def _copy(self, copies: kern_pool.DeviceCopies) -> None:
        kv = self.machine.kv
        for src, dst in copies.pages:
            kv[self._page(dst)] = kv[self._page(src)]

    def lease(self, tokens: int) -> kern_pool.Lease:
        lease = self.pool.lease(tokens)
        self._zero(lease.pages)
        return lease

    def retire(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        return self.pool.retire(lease, length)

    def checkpoint(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        checkpoint, copies = self.pool.checkpoint(lease, length)
        self._copy(copies)
        return checkpoint

    def restore(self, checkpoint: kern_pool.Checkpoint, length: int, tokens: int) -> kern_pool.Lease:
        lease, copies = self.pool.restore(checkpoint, length, tokens)
        self._zero(lease.pages[lease.sealed :])
        self._copy(copies)
        return lease

    def fork(self, parent: kern_pool.Lease, length: int, tokens: int) -> kern_pool.Lease:
        lease, copies = self.pool.fork(parent, length, tokens)
        self._zero(lease.pages[lease.sealed :])
        self._copy(copies)
        return lease

    @property
    def host(self) -> kern_pool.Host:
        assert self._host is not None, "no host tier"
        return self._host

    def park(self, checkpoint: kern_pool.Checkpoint) -> kern_pool.Parked:
        self._land()
        parked, copies = self.host.park(checkpoint)
        for page, unit in copies.pages:
            self.host_kv[self._page(unit)] = self.machine.kv[self._page(page)]
        return parked

    def wake_now(self, parked: kern_pool.Parked, length: int, tokens: int) -> kern_pool.Lease:
        lease, copies = self.host.restore(parked, length, tokens)
        self._zero(lease.pages[lease.sealed :])
        for unit, page in copies.pages:
            self.machine.kv[self._page(page)] = self.host_kv[self._page(unit)]
        self._flying.append(parked.clone())
        return lease

    def settle(self) -> None:
        plan = self.pool.pending
        if plan is not None:
            self.pool.complete(plan)
