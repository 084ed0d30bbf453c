"""The generator's errors: each message is one actionable line."""

from __future__ import annotations

__all__ = ["ConfigError", "GenError", "KernelsError"]


class GenError(Exception):
    """Base of the generator's errors."""


class ConfigError(GenError):
    """The config.json does not describe a Qwen3 model this generator supports."""


class KernelsError(GenError):
    """The kernel sources or hashes do not provide every entry the manifest needs."""
