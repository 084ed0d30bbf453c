"""The kern_pool error tree: caller mistakes, bad configurations, and typed denials.

`ApiError` and `ConfigError` are bugs of whoever called (fix the call or the config). `Denied` and
its subclasses are answers, not bugs: the request is well-formed but cannot be met now (or ever),
and the subclass says what the caller should do next. Every call that raises leaves the pool, the
host tier and the prefix index exactly as they were.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "Busy",
    "ConfigError",
    "Denied",
    "ExceedsPool",
    "ExceedsRow",
    "HostFull",
    "PoolError",
    "Remapping",
]


class PoolError(Exception):
    """Root of every error kern_pool raises on purpose."""


class ApiError(PoolError):
    """The caller broke the API contract (bad length, released or foreign handle, ...)."""


class ConfigError(PoolError):
    """A pool configuration cannot describe a pool (the provider or its builder must fix it)."""


class Denied(PoolError):
    """A well-formed request the pool cannot grant; the subclass names the next step."""


class Remapping(Denied):
    """A remap plan is in flight: execute it, call `Pool.complete`, ask again (do not evict)."""

    def __init__(self) -> None:
        super().__init__("a remap plan is in flight: complete it, then ask again (do not evict)")


class Busy(Denied):
    """Held objects are in the way: release or evict something, then ask again."""

    def __init__(self, pages: int, slots: int) -> None:
        super().__init__(f"busy: {pages} page(s) and {slots} slot(s) not free; evict something")
        self.pages = pages
        self.slots = slots


class ExceedsPool(Denied):
    """No layout of the whole budget holds the request; it can never be granted."""

    def __init__(self, pages: int, slots: int) -> None:
        super().__init__(f"{pages} page(s) and {slots} slot(s) exceed the pool's whole budget")
        self.pages = pages
        self.slots = slots


class ExceedsRow(Denied):
    """The request is longer than one page-table row; it can never be granted."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"longer than one page-table row: at most {limit} tokens per sequence")
        self.limit = limit


class HostFull(Denied):
    """The host tier cannot hold the parked copy; nothing was kept. Drop a parked entry first."""

    def __init__(self, units: int, free: int) -> None:
        super().__init__(f"host tier full: needs {units} unit(s), {free} free; drop a parked entry")
        self.units = units
        self.free = free
