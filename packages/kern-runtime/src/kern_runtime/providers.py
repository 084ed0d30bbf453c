"""Model families, registered by their providers through the `kern.providers` entry-point group.

kern_runtime imports no provider. A provider package names one object in its pyproject:

    [project.entry-points."kern.providers"]
    qwen3 = "kern_qwen3.provider:QWEN3"

and that object answers the `Provider` protocol: the family's name, the manifest `model` name
prefixes it recognises, its chat template, its stop texts, its seeded random checkpoint and its
prefill FLOP count. `find(manifest)` returns the one installed provider whose prefix starts the
manifest's `model` name; none (or two) is one `ProviderError` line naming the installed families.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kern_manifest import Manifest, name_list, short

from .errors import ApiError

__all__ = ["GROUP", "Provider", "ProviderError", "find", "installed"]

GROUP = "kern.providers"
"""The entry-point group a provider registers its family in."""

Progress = Callable[[int, int], None]


class ProviderError(ApiError):
    """No installed provider (or more than one) recognises a manifest, or an entry point of the
    group is not a provider (caller: install the family's provider or fix its registration)."""


@runtime_checkable
class Provider(Protocol):
    """What kern_cli asks a model family for. Every callable raises only `errors` for bad input."""

    @property
    def name(self) -> str:
        """The family's name (`qwen3`)."""
        ...

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Lower-case prefixes of the manifest `model` names of this family."""
        ...

    @property
    def stop_texts(self) -> tuple[str, ...]:
        """The special tokens that end an assistant turn."""
        ...

    @property
    def special_texts(self) -> tuple[str, ...]:
        """Every special token of the family's chat text (the stop texts among them)."""
        ...

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """The provider's one-line input errors, which its callables raise."""
        ...

    @property
    def generator(self) -> str:
        """The command that writes this family's manifests (named in messages)."""
        ...

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The chat text of `messages` ({"role", "content"}), ending in the generation prompt."""
        ...

    def random_checkpoint(self, manifest: Mapping[str, Any], progress: Progress | None) -> tuple[Path, str, bool]:
        """A seeded random checkpoint the manifest loads: (directory, what it is, written now)."""
        ...

    def prefill_flops(self, config: Mapping[str, Any], tokens: int) -> float:
        """FLOPs of a forward over `tokens` prompt tokens of the checkpoint's config.json."""
        ...


@functools.cache
def installed() -> tuple[Provider, ...]:
    """The providers of every installed `kern.providers` entry point (loaded once).

    Raises:
        ProviderError: an entry point does not load or is not a `Provider`.
    """
    found: list[Provider] = []
    for ep in entry_points(group=GROUP):
        try:
            obj = ep.load()
        except Exception as exc:
            raise ProviderError(f"{GROUP} entry point {short(ep.name)} ({short(ep.value)}) does not load: "
                                f"{type(exc).__name__}: {short(str(exc))}") from None
        if not isinstance(obj, Provider):
            raise ProviderError(f"{GROUP} entry point {short(ep.name)} ({short(ep.value)}) is a "
                                f"{type(obj).__name__}, not a kern_runtime.providers.Provider")
        found.append(obj)
    return tuple(found)


def find(manifest: Manifest | Mapping[str, Any], providers: Iterable[Provider] | None = None) -> Provider:
    """The one provider (of `providers`, default `installed()`) whose prefix starts the manifest's
    `model` name (case-insensitive; `manifest`: the kern_manifest model, or plain JSON).

    Raises:
        ProviderError: none or several recognise it; the line names the installed families.
    """
    have = tuple(installed() if providers is None else providers)
    model = manifest.model if isinstance(manifest, Manifest) else str(manifest.get("model", ""))
    hits = [p for p in have if model.lower().startswith(tuple(p.prefixes))]
    if len(hits) == 1:
        return hits[0]
    families = name_list(p.name for p in have) or "none"
    if hits:
        raise ProviderError(f"model {short(model)!r} is claimed by several providers: {name_list(p.name for p in hits)}")
    raise ProviderError(f"no installed model provider knows model {short(model)!r} (installed families: {families})")
