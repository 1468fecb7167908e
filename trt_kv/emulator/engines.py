"""What the emulated TensorRT runtime knows about engine bytes: the network each was built from.

A real engine holds compiled kernels; an emulated one runs the network it was built from on
:mod:`trt_kv.interpreter`. Deserializing therefore needs that network, found by the sha256 of
the engine bytes, from one of two sources:

- **built in this process** while the emulator is installed: a hook on
  ``Builder.build_serialized_network`` records the network, with the optimization profiles
  added to its builder config, the moment the engine bytes exist;
- **an engine file given to** ``emulated_gpu(engines=[...])`` (a file, or a folder of
  them) whose sidecar records this sha256 and a ``recipe`` (written by the engine store),
  from which the rebuild function given as ``emulated_gpu(rebuild=fn)`` makes the network
  again: ``fn(recipe, metadata) -> (network, profiles, keep)``, with the sidecar's
  ``recipe`` and its whole ``metadata``; ``profiles`` are the
  :class:`~trt_kv.builder.engine.Profile` objects the build added, ``keep`` what keeps the
  network's weights alive until it is compiled. The emulator itself knows no models: trt_kv's
  rebuild function is ``trt_kv.engine.recipes.recipe_rebuilder(models)`` (the documentation
  example, or a model of any architecture from the one of ``models`` whose weights hash to
  the recorded sha256), which the CLI's ``--emulate-gpu`` and the tests pass in. Without one,
  such an engine is refused, saying what to pass. The rebuilt network must have the
  sidecar's I/O, and the profiles come from the rebuild (the functions the build called): a
  sidecar whose ``profiles`` differ is refused, as a real engine keeps the profiles it was
  built with.

Any other network that honours the decoder contract runs emulated when it is built in the
process under ``emulated_gpu()`` (the first source): that is the hook for a user's network.

Anything else is refused: ``deserialize_cuda_engine`` returns None and logs why. The
engine's targets (its compute capabilities, ``()``: portable) come from the builder config
(built here) or the sidecar.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_kv import _trt, dtypes
from trt_kv._trt import trt
from trt_kv.builder.engine import Profile
from trt_kv.builder.kv_cache import cache_aliases
from trt_kv.emulator.memory import EmulatorError
from trt_kv.engine.file import EngineMeta, read_sidecar, sidecar_path
from trt_kv.errors import TrtKvError, mismatch
from trt_kv.interpreter import Plan, compile_network

Shape = tuple[int, ...]
ProfileShapes = Mapping[str, tuple[Shape, Shape, Shape]]  # input -> (min, opt, max)


@dataclass(frozen=True)
class IOTensor:
    """One engine input or output: declared shape (-1 = dynamic), dtype and, for inputs, the
    dimension names (``ITensor.set_dimension_name``; None where unnamed)."""

    name: str
    is_input: bool
    shape: Shape
    dtype: np.dtype
    dim_names: tuple[str | None, ...] = ()

    @property
    def trt_dtype(self) -> object:
        return dtypes.to_trt(self.dtype)


@dataclass(frozen=True)
class LayerTensor:
    """A layer input or output as the network declares it (-1: dynamic)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # trt.DataType member name, e.g. "HALF"


@dataclass(frozen=True)
class LayerRecord:
    """One network layer: name, type (``trt.LayerType`` name) and tensors."""

    name: str
    kind: str
    inputs: tuple[LayerTensor, ...]
    outputs: tuple[LayerTensor, ...]


def record_layers(network: object) -> tuple[LayerRecord, ...]:
    """Every layer of ``network`` (alive), in network order; absent optional inputs skipped."""

    def tensor(t: object) -> LayerTensor:
        return LayerTensor(t.name, tuple(t.shape), t.dtype.name)

    layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        ins = (layer.get_input(k) for k in range(layer.num_inputs))
        outs = (layer.get_output(k) for k in range(layer.num_outputs))
        layers.append(
            LayerRecord(
                layer.name,
                layer.type.name,
                tuple(tensor(t) for t in ins if t is not None),
                tuple(tensor(t) for t in outs),
            )
        )
    return tuple(layers)


@dataclass(frozen=True)
class EngineRecord:
    """Everything an emulated ``ICudaEngine`` answers from, and the plan it runs."""

    sha256: str
    tensors: tuple[IOTensor, ...]  # inputs, then outputs, in network order
    profiles: tuple[dict[str, tuple[Shape, Shape, Shape]], ...]
    aliases: dict[str, str]  # output name -> the input it aliases
    plan: Plan
    num_layers: int
    layers: tuple[LayerRecord, ...]  # the network's, for the engine inspector
    profiling_verbosity: object  # trt.ProfilingVerbosity the engine was built with
    targets: tuple[tuple[int, int], ...] = ()  # compute capabilities built for (): portable

    def tensor(self, name: str) -> IOTensor | None:
        return next((t for t in self.tensors if t.name == name), None)


def record_network(
    network: object,
    profiles: Sequence[ProfileShapes],
    sha256: str,
    profiling_verbosity: object = None,
    targets: tuple[tuple[int, int], ...] = (),
) -> EngineRecord:
    """Compile ``network`` for the interpreter (its weights must still be alive) and describe
    its I/O and layers. With no profile (a static network) the one implicit profile is the
    static shapes: "If none of the inputs are dynamic, the default optimization profile will
    be generated automatically" (IOptimizationProfile). ``profiling_verbosity`` None:
    TensorRT's default, ``LAYER_NAMES_ONLY`` ("By default, the profiling verbosity is set to
    ProfilingVerbosity.LAYER_NAMES_ONLY", EngineInspector), which is what trt_kv builds
    with (``trt_kv.builder.build_engine`` sets none)."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    outputs = [network.get_output(i) for i in range(network.num_outputs)]
    tensors = tuple(
        IOTensor(t.name, is_input, tuple(t.shape), dtypes.to_numpy(t.dtype), _dim_names(t))
        for ts, is_input in ((inputs, True), (outputs, False))
        for t in ts
    )
    static = {t.name: (t.shape, t.shape, t.shape) for t in tensors if t.is_input}
    full = tuple({**static, **{k: tuple(map(tuple, v)) for k, v in p.items()}} for p in profiles)
    return EngineRecord(
        sha256=sha256,
        tensors=tensors,
        profiles=full or (static,),
        aliases={a.output: a.input for a in cache_aliases(network)},
        plan=compile_network(network),
        num_layers=network.num_layers,
        layers=record_layers(network),
        profiling_verbosity=profiling_verbosity or trt.ProfilingVerbosity.LAYER_NAMES_ONLY,
        targets=targets,
    )


def _dim_names(tensor: object) -> tuple[str | None, ...]:
    """The dimension names of a network input (empty for outputs, or without the feature)."""
    if not (_trt.FEATURES.dimension_names and tensor.is_network_input):
        return ()
    return tuple(tensor.get_dimension_name(d) for d in range(len(tuple(tensor.shape))))


# sha256 -> the record, or why none could be made (a network the interpreter cannot run)
_RECORDS: dict[str, EngineRecord | str] = {}
_PROFILES: dict[int, tuple[object, list[object]]] = {}  # id(config) -> (config, profiles)
# (network, its optimization profiles, what keeps its weights alive)
Rebuilt = tuple[object, Sequence[Profile], object]
RebuildFn = Callable[[dict, dict], Rebuilt]  # (sidecar recipe, sidecar metadata) -> Rebuilt
# what emulated_gpu(engines=..., rebuild=...) gave the active blocks: engine files or
# folders (until the outermost block ends), rebuild functions (innermost last, each until
# the block that gave it ends)
_SOURCES: dict[str, list] = {"engines": [], "rebuild": []}


def add_sources(engines: Iterable[str | Path], rebuild: RebuildFn | None = None) -> None:
    """Engine files (or folders of them) the active block may rebuild from (read only when
    an engine of unknown bytes is deserialized), and the function that rebuilds their
    recipes' networks (None: the enclosing block's, if any)."""
    _SOURCES["engines"] += [Path(p) for p in engines]
    if rebuild is not None:
        _SOURCES["rebuild"].append(rebuild)


def drop_rebuild(rebuild: RebuildFn | None) -> None:
    """Forget ``rebuild`` (the block that gave it ended; None: nothing to forget)."""
    if rebuild is not None:
        _SOURCES["rebuild"].remove(rebuild)


def clear_sources() -> None:
    """Forget the sources (the outermost block ended)."""
    _SOURCES["engines"].clear()
    _SOURCES["rebuild"].clear()


def sidecar_of(sha: str) -> EngineMeta | None:
    """The sidecar, among the engine files given to ``emulated_gpu(engines=...)``, that
    records engine bytes of sha256 ``sha``; None when none does (an unreadable or malformed
    sidecar is passed over)."""
    for source in _SOURCES["engines"]:
        files = sorted(source.glob("*.engine")) if source.is_dir() else [source]
        for path in files:
            side = sidecar_path(path)
            if not side.is_file():
                continue
            try:
                meta = read_sidecar(side)
            except TrtKvError:
                continue
            if meta.sha256 == sha:
                return meta
    return None


def targets_of(data: bytes) -> tuple[tuple[int, int], ...]:
    """The compute capabilities engine bytes ``data`` were built for (``()``: portable, also
    for bytes the emulator has no record or sidecar of)."""
    sha = hashlib.sha256(data).hexdigest()
    found = _RECORDS.get(sha)
    if isinstance(found, EngineRecord):
        return found.targets
    meta = sidecar_of(sha)
    return meta.targets if meta is not None else ()


def lookup(data: bytes) -> EngineRecord:
    """The record for engine bytes ``data``.

    Raises:
        EmulatorError: no network is known for these bytes (not built in this process under
            the emulator, no sidecar with a recipe among ``emulated_gpu(engines=...)``), the
            recipe's network differs from the engine's, or the interpreter cannot run it.
    """
    sha = hashlib.sha256(data).hexdigest()
    if sha not in _RECORDS:
        meta = sidecar_of(sha)
        if meta is not None:
            try:
                _RECORDS[sha] = _rebuild(meta)
            except TrtKvError as err:
                raise EmulatorError(f"engine sha256 {sha[:16]}: {err}") from err
    found = _RECORDS.get(sha)
    if found is None:
        raise EmulatorError(
            mismatch(
                f"engine sha256 {sha[:16]}",
                "an engine built in this process under emulated_gpu(), or a file given to "
                "emulated_gpu(engines=[...]) whose sidecar has a recipe",
                "",
                "bytes the emulator has never seen",
            )
        )
    if isinstance(found, str):
        raise EmulatorError(f"engine sha256 {sha[:16]}: {found}")
    return found


def _rebuild(meta: EngineMeta) -> EngineRecord:
    """Rebuild the network of a sidecar's recipe and check it is the engine's."""
    recipe = meta.metadata.get("recipe")
    if recipe is None:
        raise EmulatorError(
            "expected a sidecar with a 'recipe' (trt_kv records one since the emulator "
            "exists), got none: rebuild the engine (trt-kv build), or build it in this process"
        )
    network, profiles, keep = _network_from_recipe(recipe, meta.metadata)
    declared = tuple((t.name, tuple(t.shape), t.dtype) for t in meta.inputs + meta.outputs)
    ins = [network.get_input(i) for i in range(network.num_inputs)]
    outs = [network.get_output(i) for i in range(network.num_outputs)]
    rebuilt = tuple((t.name, tuple(t.shape), dtypes.name_of(t.dtype)) for t in ins + outs)
    if rebuilt != declared:
        raise EmulatorError(mismatch("recipe network", "the sidecar's I/O", declared, rebuilt))
    _check_profiles(profiles, meta.profiles)  # the build's, not whatever the sidecar says
    shapes = [p.shapes for p in profiles]
    record = record_network(network, shapes, meta.sha256, targets=meta.targets)
    del keep  # the plan holds its own copy of every weight
    return record


def _check_profiles(built: Sequence[Profile], said: Sequence[Profile]) -> None:
    """Raises EmulatorError naming the first profile input whose ``[min, opt, max]`` differ
    between the recipe's build (``built``) and the sidecar (``said``), or their count/names."""
    ours, theirs = [p.to_json() for p in built], [p.to_json() for p in said]
    if [p["name"] for p in ours] != [p["name"] for p in theirs]:
        names = [p["name"] for p in ours], [p["name"] for p in theirs]
        raise EmulatorError(mismatch("sidecar profiles", "those the recipe builds", *names))
    for a, b in zip(ours, theirs):
        for name in sorted(a["shapes"].keys() | b["shapes"].keys()):
            mine, yours = a["shapes"].get(name), b["shapes"].get(name)
            if mine != yours:
                where = f"sidecar profile {a['name']} input {name}"
                raise EmulatorError(mismatch(where, "[min, opt, max] as built", mine, yours))


def _network_from_recipe(recipe: dict, md: dict) -> Rebuilt:
    """``(network, its optimization profiles, what keeps its weights alive)`` for a recipe,
    from the rebuild function of the innermost block that gave one.

    Raises:
        EmulatorError: no block gave a rebuild function, or it failed (its error, after the
            recipe's network name).
    """
    if not _SOURCES["rebuild"]:
        raise EmulatorError(
            mismatch(
                f"recipe {recipe.get('network')!r} (an engine built in another process)",
                "emulated_gpu(rebuild=fn) to rebuild its network, e.g. "
                "rebuild=trt_kv.engine.recipes.recipe_rebuilder([model specs])",
                "",
                "no rebuild function",
            )
        )
    try:
        return _SOURCES["rebuild"][-1](recipe, md)
    except TrtKvError as err:
        raise EmulatorError(f"recipe {recipe.get('network')!r}: {err}") from err


# -- hooks: installed by the emulator, removed when it is uninstalled ------------------------
def install_hooks() -> Callable[[], None]:
    """Record engines built from now on; returns the undo."""
    builder_cls, config_cls = trt.Builder, trt.IBuilderConfig
    real_build = builder_cls.build_serialized_network
    real_add = config_cls.add_optimization_profile

    def add_optimization_profile(config: object, profile: object) -> int:
        index = real_add(config, profile)
        _PROFILES.setdefault(id(config), (config, []))[1].append(profile)
        return index

    def build_serialized_network(builder: object, network: object, config: object) -> object:
        data = real_build(builder, network, config)
        if data is not None:
            _, profiles = _PROFILES.pop(id(config), (config, []))
            sha = hashlib.sha256(memoryview(data)).hexdigest()
            _RECORDS[sha] = _record_build(network, profiles, sha, config)
        return data

    builder_cls.build_serialized_network = build_serialized_network
    config_cls.add_optimization_profile = add_optimization_profile

    def undo() -> None:
        builder_cls.build_serialized_network = real_build
        config_cls.add_optimization_profile = real_add
        _PROFILES.clear()

    return undo


def _config_targets(config: object) -> tuple[tuple[int, int], ...]:
    """The compute capabilities a builder config targets (``SM89`` -> ``(8, 9)``); ``()``
    for a portable build (none set, or a module without the call)."""
    count = getattr(config, "num_compute_capabilities", 0)
    values = [int(config.get_compute_capability(i)) for i in range(count)]
    return tuple(sorted((v // 10, v % 10) for v in values if v >= 10))  # not NONE, CURRENT


def _record_build(
    network: object, profiles: list[object], sha: str, config: object
) -> EngineRecord | str:
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    shapes = [
        {
            t.name: tuple(tuple(d) for d in p.get_shape(t.name))
            for t in inputs
            if -1 in tuple(t.shape)
        }
        for p in profiles
    ]
    try:
        return record_network(
            network, shapes, sha, config.profiling_verbosity, _config_targets(config)
        )
    except TrtKvError as err:  # the engine exists; only running it on the CPU is impossible
        return f"the interpreter cannot run this engine's network ({err})"
