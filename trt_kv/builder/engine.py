"""Network -> serialized engine, as small composable steps (Polygraphy-style)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from trt_kv._trt import logger as _logger
from trt_kv._trt import trt
from trt_kv.builder.kv_cache import cache_update_layers
from trt_kv.errors import NetworkError, ShapeError, mismatch
from trt_kv.progress import build_monitor

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One optimization profile: input name -> (min, opt, max) shape."""

    name: str
    shapes: dict[str, tuple[Shape, Shape, Shape]]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "shapes": {k: [list(s) for s in v] for k, v in self.shapes.items()},
        }

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        return cls(d["name"], {k: tuple(tuple(s) for s in v) for k, v in d["shapes"].items()})


@dataclass(frozen=True)
class BuiltEngine:
    """Serialized engine bytes and how long the build took."""

    data: bytes
    build_seconds: float


def create_network() -> tuple[object, object]:
    """A fresh ``(builder, network)`` pair; the network is STRONGLY_TYPED."""
    builder = trt.Builder(_logger())
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder, builder.create_network(flags)


def cache_update_method(network: object) -> str | None:
    """ "layer" or "plugin": how ``network`` updates its caches (None: no cache updates)."""
    updates = cache_update_layers(network)
    return updates[0][0] if updates else None


def _check_profile(network: object, profile: Profile) -> None:
    inputs = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    missing = [n for n, t in inputs.items() if -1 in tuple(t.shape) and n not in profile.shapes]
    if missing:
        raise ShapeError(
            mismatch(
                f"profile {profile.name!r}",
                "shapes for dynamic inputs",
                missing,
                sorted(profile.shapes),
            )
        )
    for name, (lo, opt, hi) in profile.shapes.items():
        if name not in inputs:
            raise NetworkError(
                mismatch(f"profile {profile.name!r}", "a network input", sorted(inputs), name)
            )
        declared = tuple(inputs[name].shape)
        for shape in (lo, opt, hi):
            if len(shape) != len(declared) or any(
                d != -1 and d != s for d, s in zip(declared, shape)
            ):
                raise ShapeError(
                    mismatch(
                        f"{name} in profile {profile.name!r}", "a shape matching", declared, shape
                    )
                )


def build_engine(
    builder: object,
    network: object,
    profiles: list[Profile],
    *,
    optimization_level: int | None = None,
) -> BuiltEngine:
    """Build ``network`` with ``profiles`` into serialized engine bytes (no GPU needed with
    TensorRT-RTX, which compiles ahead of time)."""
    config = builder.create_builder_config()
    if cache_update_method(network) == "plugin":
        from trt_kv.plugin import enable_aliased_io

        enable_aliased_io(config)  # the plugin's output 0 aliases its cache input
    for profile in profiles:
        _check_profile(network, profile)
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    if optimization_level is not None:
        config.builder_optimization_level = optimization_level
    monitor = build_monitor()  # a progress bar over the builder's phases (None: bars off)
    if monitor is not None:
        config.progress_monitor = monitor
    start = time.perf_counter()
    data = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if monitor is not None:
        monitor.bar.close()
    if data is None:
        raise NetworkError(
            mismatch(
                "network",
                "a successful engine build",
                "engine bytes",
                "None (see the TensorRT log above)",
            )
        )
    return BuiltEngine(bytes(data), seconds)
