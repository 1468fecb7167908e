"""Network -> serialized engine, as small composable steps (Polygraphy-style)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from numbers import Integral

from trt_kv._trt import logger as _logger
from trt_kv._trt import trt
from trt_kv.builder.kv_cache import cache_update_layers
from trt_kv.errors import ArgumentError, NetworkError, ShapeError, check_int, mismatch
from trt_kv.interrupts import held_sigint
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
    for name, triple in profile.shapes.items():
        if not isinstance(triple, (list, tuple)) or len(triple) != 3:
            raise ShapeError(
                mismatch(f"{name} in profile {profile.name!r}", "(min, opt, max)", "", triple)
            )
        lo, opt, hi = (tuple(x) if isinstance(x, (list, tuple)) else x for x in triple)
        if not all(isinstance(x, tuple) for x in (lo, opt, hi)):
            raise ShapeError(
                mismatch(f"{name} in profile {profile.name!r}", "three shapes", "", triple)
            )
        if name not in inputs:
            raise NetworkError(
                mismatch(f"profile {profile.name!r}", "a network input", sorted(inputs), name)
            )
        declared = tuple(inputs[name].shape)
        where = f"{name} in profile {profile.name!r}"
        for shape in (lo, opt, hi):
            if len(shape) != len(declared) or any(
                d != -1 and d != s for d, s in zip(declared, shape)
            ):
                raise ShapeError(mismatch(where, "a shape matching", declared, shape))
            if any(isinstance(s, bool) or not isinstance(s, Integral) or s < 0 for s in shape):
                raise ShapeError(mismatch(where, "sizes that are integers >= 0", "", shape))
        if any(a > b for a, b in zip(lo, opt)) or any(a > b for a, b in zip(opt, hi)):
            raise ShapeError(mismatch(where, "min <= opt <= max on every axis", "", (lo, opt, hi)))
    _check_update_shapes(network, profile)


def _update_axes(update_rank: int) -> dict[str, tuple[int, int]]:
    """The axes of a cache update (padded ``[B, N, S, H]`` or packed ``[T, N, H]``) that
    must equal the cache's N and H: name -> (update axis, cache axis)."""
    return {"N (axis 1)": (1, 1), f"H (axis {update_rank - 1})": (update_rank - 1, 3)}


def _check_update_shapes(network: object, profile: Profile) -> None:
    """A cache update that is a network input must have, at the profile's min, opt and max,
    the cache's N and H (TensorRT refuses it at build time, naming neither tensor), and a
    padded one ``[B, N, S, H]`` may not reach S > S_max (TensorRT builds it with only a
    warning; every such write is skipped)."""
    for _, layer in cache_update_layers(network):
        cache, update = layer.get_input(0), layer.get_input(1)
        shapes = profile.shapes.get(update.name)
        if shapes is None:
            continue
        where, dims = f"{update.name} in profile {profile.name!r}", tuple(cache.shape)
        for which, shape in zip(("min", "opt", "max"), shapes):
            for axis, (i, c) in _update_axes(len(shape)).items():
                if dims[c] != -1 and shape[i] != dims[c]:
                    want = f"{which} {axis} of cache {cache.name}"
                    raise ShapeError(mismatch(where, want, dims[c], shape[i]))
        s_max, width = dims[2], shapes[2][2]
        if len(shapes[2]) == 4 and width > s_max:
            raise ShapeError(
                mismatch(where, f"max S (axis 2) <= S_max = {s_max} of {cache.name}", "", width)
            )


def _update_error(network: object, said: str) -> ShapeError | None:
    """TensorRT's refusal of a cache update whose N or H differ from its cache's (an update
    computed in the network, whose sizes no profile names) as a ShapeError naming the
    update and the cache; None for any other error."""
    if "must have the same number of heads" not in said:
        return None
    for _, layer in cache_update_layers(network):
        if f"{layer.name}:" in said:
            cache, update = layer.get_input(0), layer.get_input(1)
            axes = " and ".join(_update_axes(len(update.shape)))
            dims = tuple(cache.shape)
            return ShapeError(
                mismatch(
                    f"{update.name} (update of cache {cache.name})",
                    f"{axes} of the cache {dims[1]} and {dims[3]} in every profile",
                    "",
                    f"other sizes (TensorRT: {said})",
                )
            )
    return None


def _set_targets(config: object, targets: tuple[tuple[int, int], ...]) -> None:
    """``IBuilderConfig.set_compute_capability`` for each target (``(8, 9)`` -> ``SM89``).

    Raises:
        ArgumentError: the module has no ``set_compute_capability``, or refuses a target.
    """
    if not hasattr(config, "set_compute_capability"):
        raise ArgumentError(
            mismatch("targets", "a TensorRT with set_compute_capability for", targets, "none")
        )
    config.num_compute_capabilities = len(targets)
    for i, (major, minor) in enumerate(targets):
        member = getattr(trt.ComputeCapability, f"SM{major}{minor}", None)
        if member is None or not config.set_compute_capability(member, i):
            raise ArgumentError(
                mismatch("targets", "compute capabilities TensorRT can target", "", targets)
            )


def build_engine(
    builder: object,
    network: object,
    profiles: list[Profile],
    *,
    optimization_level: int | None = None,
    targets: tuple[tuple[int, int], ...] = (),
) -> BuiltEngine:
    """Build ``network`` with ``profiles`` into serialized engine bytes (no GPU needed with
    TensorRT-RTX, which compiles ahead of time), for the compute capabilities ``targets``
    (``()``: a portable engine). Every profile is checked first. Ctrl-C during the build
    cancels it through the progress monitor and raises KeyboardInterrupt once TensorRT has
    stopped (nothing is returned, so nothing is written).

    Raises:
        ArgumentError: ``profiles`` not a list of :class:`Profile`; ``optimization_level``
            not an integer in [0, 5].
        ShapeError, NetworkError: a profile that misses a dynamic input, names a tensor that
            is not an input, mismatches a declared shape, has min > opt or opt > max, gives
            a cache update input another N or H than its cache's, or lets a padded one grow
            past S_max.
        ArgumentError: ``targets`` the module cannot build for.
        NetworkError: TensorRT returned no engine (ShapeError naming the update and the
            cache when it refused a computed cache update's N or H).
        KeyboardInterrupt: Ctrl-C during the build.
    """
    if not isinstance(profiles, (list, tuple)) or not all(isinstance(p, Profile) for p in profiles):
        raise ArgumentError(mismatch("profiles", "a list of Profile", "", repr(profiles)))
    if optimization_level is not None:
        check_int("optimization_level", optimization_level, 0, 5)
    for profile in profiles:
        _check_profile(network, profile)
    config = builder.create_builder_config()
    if cache_update_method(network) == "plugin":
        from trt_kv.plugin import enable_aliased_io

        enable_aliased_io(config)  # the plugin's output 0 aliases its cache input
    for profile in profiles:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    if optimization_level is not None:
        config.builder_optimization_level = optimization_level
    if targets:
        _set_targets(config, targets)
    monitor = build_monitor()  # a progress bar over the builder's phases; Ctrl-C cancels
    config.progress_monitor = monitor
    log = _logger()
    errors_before = log.error_count
    start = time.perf_counter()
    try:
        # Ctrl-C cancels through the monitor instead of raising inside a TensorRT callback
        # (where TensorRT swallows it and builds on); TensorRT stops at its next step
        with held_sigint() as held:
            uncancel = held.cancel_with(monitor.cancel)
            try:
                data = builder.build_serialized_network(network, config)
            finally:
                uncancel()
    finally:
        monitor.close()
    seconds = time.perf_counter() - start
    if monitor.cancelled:
        raise KeyboardInterrupt("the TensorRT build was cancelled")
    if data is None:
        said = log.last_error if log.error_count > errors_before else "no error logged"
        raise _update_error(network, said) or NetworkError(
            mismatch("network", "an engine from build_serialized_network", "", f"None ({said})")
        )
    return BuiltEngine(bytes(data), seconds)
