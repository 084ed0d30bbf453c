"""kern_pool: the pure host-side memory planner.

Decides where sequence memory lives (chunks, pages, slots, checkpoint chains, the prefix index,
the host tier) and returns the decisions as plain data (`Remap`, `Copies`) that the runtime
executes. No CUDA, no clock, no randomness: the same calls give the same decisions.
"""

from kern_pool._kinds import Status
from kern_pool.chunks import (
    CHUNK_CAP,
    GRANULE,
    HEADROOM,
    Capacity,
    ChunkId,
    Grant,
    LineTable,
    Map,
    PagedState,
    PageId,
    PoolConfig,
    Remap,
    SeqState,
    SlotId,
    TokenId,
    Unmap,
    chunk_bytes,
    pool_config,
)
from kern_pool.errors import (
    ApiError,
    Busy,
    ConfigError,
    Denied,
    ExceedsPool,
    ExceedsRow,
    HostFull,
    PoolError,
    Remapping,
)
from kern_pool.host import Host, HostUnit, ParkCopies, Parked, WakeCopies
from kern_pool.pages import Checkpoint, Copies, DeviceCopies, Lease, Pool, PoolSnapshot
from kern_pool.prefix import Evicted, Hit, Kept, Prefix, Tier

__all__ = [
    "CHUNK_CAP",
    "GRANULE",
    "HEADROOM",
    "ApiError",
    "Busy",
    "Capacity",
    "Checkpoint",
    "ChunkId",
    "ConfigError",
    "Copies",
    "Denied",
    "DeviceCopies",
    "Evicted",
    "ExceedsPool",
    "ExceedsRow",
    "Grant",
    "Hit",
    "Host",
    "HostFull",
    "HostUnit",
    "Kept",
    "Lease",
    "LineTable",
    "Map",
    "PageId",
    "PagedState",
    "ParkCopies",
    "Parked",
    "Pool",
    "PoolConfig",
    "PoolError",
    "PoolSnapshot",
    "Prefix",
    "Remap",
    "Remapping",
    "SeqState",
    "SlotId",
    "Status",
    "Tier",
    "TokenId",
    "Unmap",
    "WakeCopies",
    "chunk_bytes",
    "pool_config",
]
