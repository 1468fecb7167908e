"""Which optimization profile runs a step: the first whose [min, max] holds every shape.

trt_kv's decoder engines hold a ``decode`` profile (S = 1; what CUDA graphs capture, and the
one TensorRT tunes for single-token steps) before a ``prefill`` profile (S up to
``max_step_tokens``), so a decode step takes the decode profile and a prefill step the prefill
one. Every backend that runs a network selects per step, so a shape no profile holds fails on
the CPU exactly where it would fail on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trt_kv.builder.engine import Profile
from trt_kv.errors import ShapeError, mismatch

Shape = tuple[int, ...]


def _holds(profile: Profile, shapes: Mapping[str, Shape]) -> bool:
    for name, shape in shapes.items():
        if name not in profile.shapes:
            continue  # a static input: no range to check
        lo, _, hi = profile.shapes[name]
        if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi)):
            return False
    return True


def select_profile(profiles: Sequence[Profile], shapes: Mapping[str, Shape]) -> int:
    """Index of the first profile of ``profiles`` whose ranges hold every input shape.

    Raises:
        ShapeError: no profile holds the shapes (the message lists each profile's range of
            the first input outside it).
    """
    for index, profile in enumerate(profiles):
        if _holds(profile, shapes):
            return index
    ranges = []
    for profile in profiles:
        for name, shape in shapes.items():
            if name in profile.shapes and not _holds(profile, {name: shape}):
                lo, _, hi = profile.shapes[name]
                shown = f"{name} in {list(lo)}..{list(hi)}, got {list(shape)}"
                ranges.append(f"{profile.name}: {shown}")
                break
    raise ShapeError(mismatch("step shapes", "a profile that holds them", "", "; ".join(ranges)))
