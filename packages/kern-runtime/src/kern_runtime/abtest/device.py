"""The GPU sides of an A/B test: a `Runtime` as a `Side`, and the loader that puts A on the GPU
with its weights and B over A's kept weights (`Runtime.load(..., over=resident)`: identical weight
buffers are claimed, so the checkpoint is read once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kern_pool import Capacity

from ..runtime import Resident, Runtime
from ..weights import Safetensors
from .drive import Side
from .pair import Facts

__all__ = ["GpuLoader", "RuntimeSide"]

Progress = Callable[[int, int], None]

_ELEMENTS: Mapping[str, Any] = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32}
"""The element types of a logits buffer as `read_output` gives them (bf16 as bit patterns)."""


class RuntimeSide:
    """A loaded `Runtime` as a `Side`: `zero_states` zeroes each state's reach on the device."""

    def __init__(self, rt: Runtime, states: Mapping[str, int]) -> None:
        self.rt = rt
        self._states = dict(states)

    def write_input(self, name: str, array: ArrayLike) -> None:
        self.rt.write_input(name, array)

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        self.rt.run(program, vars)

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        self.rt.issue(program, vars)

    def read_output(self, name: str, count: int | None = None) -> NDArray[Any]:
        return self.rt.read_output(name, count)

    def read_workspace(self, name: str, count: int) -> NDArray[Any]:
        element = _ELEMENTS[self.rt.manifest.buffers[name].dtype]
        return self.rt.read_buffer(name).view(element)[:count].copy()

    def synchronize(self) -> None:
        self.rt.synchronize()

    def time_calls(self, program: str, vars: Mapping[str, int], *,
                   before: str | None = None) -> tuple[list[tuple[str, float]], bool]:
        return self.rt.time_calls(program, vars, before=before)

    def zero_states(self) -> None:
        for name, nbytes in self._states.items():
            self.rt.zero_state(name, 0, nbytes)

    def read_state(self, name: str, start: int, nbytes: int) -> NDArray[np.uint8]:
        return self.rt.read_state(name, start, nbytes)

    def into_resident(self) -> object:
        return self.rt.into_resident()

    def close(self) -> None:
        self.rt.close()


@dataclass(frozen=True, slots=True)
class GpuLoader:
    """Loads A and B on one GPU from their facts' manifests, the kernels and their checkpoints.

    Attributes:
        a: A's facts. b: B's facts.
        kernels: the directory of cubins (matched by sha256).
        weights: A's checkpoint's .safetensors files (B's too unless `weights_b` names others).
        gpu: the device ordinal.
        progress: follows the weight copies of each load.
        weights_b: B's checkpoint when it is another (an FP8 one beside a bf16 A): B then loads
            whole, after A's kept weights are freed.
    """

    a: Facts
    b: Facts
    kernels: Path
    weights: Sequence[Path]
    gpu: int
    progress: Progress | None = None
    weights_b: Sequence[Path] | None = None

    def _load(self, f: Facts, over: Resident | None, weights: Sequence[Path]) -> Side:
        page = f.roles.page_tokens
        tokens = -(-f.capacity // page) * page
        try:
            rt = Runtime.load(f.manifest, self.kernels, gpu=self.gpu, capacity=Capacity(tokens=tokens, seqs=1),
                              over=over)
        except BaseException:
            if over is not None:
                over.close()
            raise
        try:
            rt.load_weights(Safetensors.open([str(p) for p in weights]), progress=self.progress)
        except BaseException:
            rt.close()
            raise
        return RuntimeSide(rt, f.states)

    def reference(self) -> Side:
        """A on the GPU with its weights."""
        return self._load(self.a, None, self.weights)

    def candidate(self, resident: object) -> Side:
        """B over A's kept weights (`resident`: what `RuntimeSide.into_resident` returned), or,
        with a checkpoint of its own, alone once they are freed."""
        assert isinstance(resident, Resident)
        if self.weights_b is None or list(self.weights_b) == list(self.weights):
            return self._load(self.b, resident, self.weights)
        resident.close()
        return self._load(self.b, None, self.weights_b)
