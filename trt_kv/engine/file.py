"""Engine files: ``NAME.engine`` plus a JSON sidecar ``NAME.engine.json``.

The sidecar (:mod:`trt_kv.engine.sidecar`: what it holds, every field checked when read) records
what the runtime needs without deserializing the engine (which takes a GPU): TensorRT module
and version, the compute capabilities the engine was built for, alias pairs, the write-index
tensor, every network input and output, optimization profiles, the sha256 of the engine
bytes, and free-form metadata (a model config, say). Loading checks checksum and versions;
:func:`check_engine_io` checks a deserialized engine against the sidecar.

Writes are atomic: both files go to temporary names in the target folder and are renamed
into place, the sidecar last, so a reader never sees a new engine beside an old sidecar
that vouches for it; a failed or interrupted write leaves no new file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from trt_kv import dtypes
from trt_kv._trt import FEATURES
from trt_kv.builder.engine import BuiltEngine, Profile, cache_update_method
from trt_kv.builder.kv_cache import cache_aliases, cache_update_layers, source_input
from trt_kv.contract import DecoderRoles
from trt_kv.engine.sidecar import EngineMeta, TensorSpec
from trt_kv.errors import EngineFileError, mismatch
from trt_kv.interrupts import held_sigint, step

__all__ = [
    "EngineMeta",
    "TensorSpec",
    "check_engine_files",
    "check_engine_io",
    "describe",
    "load_engine_file",
    "read_sidecar",
    "save_engine",
    "sidecar_path",
]


def sidecar_path(engine_path: Path) -> Path:
    return engine_path.with_name(engine_path.name + ".json")


def _specs(tensors: list) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, tuple(t.shape), dtypes.name_of(t.dtype)) for t in tensors)


def _write_indices_name(network: object) -> str | None:
    updates = cache_update_layers(network)
    return source_input(network, updates[0][1].get_input(2)).name if updates else None


def describe(
    network: object,
    built: BuiltEngine,
    profiles: list[Profile],
    metadata: dict | None = None,
    roles: DecoderRoles | None = None,
    targets: tuple[tuple[int, int], ...] = (),
) -> EngineMeta:
    """The sidecar content of an engine built from ``network`` for ``targets`` (``()``:
    portable); ``roles``: its decoder contract, :func:`~trt_kv.builder.contract.decoder_roles`,
    for an engine a session runs."""
    return EngineMeta(
        trt_module=FEATURES.module,
        trt_version=FEATURES.version,
        sha256=hashlib.sha256(built.data).hexdigest(),
        nbytes=len(built.data),
        aliases=tuple(cache_aliases(network)),
        write_indices=_write_indices_name(network),
        inputs=_specs([network.get_input(i) for i in range(network.num_inputs)]),
        outputs=_specs([network.get_output(i) for i in range(network.num_outputs)]),
        profiles=tuple(profiles),
        build_seconds=round(built.build_seconds, 3),
        metadata=metadata or {},
        cache_update=cache_update_method(network),
        roles=roles,
        targets=targets,
    )


def save_engine(path: Path | str, built: BuiltEngine, meta: EngineMeta) -> Path:
    """Write the engine bytes and the sidecar atomically; returns the engine path.

    Both go to temporary files in ``path``'s folder (``.NAME.engine.<pid>.tmp``), then the
    old sidecar (if any) is removed, the engine renamed into place, and the sidecar last. A
    failure at any point removes the temporary files: the folder then holds no new file (an
    old engine may remain without its sidecar: readers treat it as absent). Ctrl-C is held
    (:func:`trt_kv.interrupts.held_sigint`): before the renames it stops the write (no new
    file), during them it waits for both; KeyboardInterrupt is raised either way.

    Raises:
        EngineFileError: the folder cannot be made or the files cannot be written (a parent
            that is a file, no permission, a full disk...); the OSError is the cause.
    """
    path = Path(path)
    side = sidecar_path(path)
    temps = [path.with_name(f".{p.name}.{os.getpid()}.tmp") for p in (path, side)]
    text = (json.dumps(meta.to_json(), indent=2) + "\n").encode()
    try:
        with held_sigint() as held:  # Ctrl-C: neither file before the renames, both after
            path.parent.mkdir(parents=True, exist_ok=True)
            for temp, data in zip(temps, (built.data, text)):
                with open(temp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            step("temporaries written")
            held.check()  # the last point where stopping leaves no new file
            side.unlink(missing_ok=True)  # the old sidecar must not vouch for the new engine
            step("old sidecar removed")
            os.replace(temps[0], path)
            step("engine renamed")
            os.replace(temps[1], side)
            step("sidecar renamed")
    except OSError as err:
        raise EngineFileError(
            mismatch(str(path), "a writable location", "", f"{type(err).__name__}: {err}")
        ) from err
    finally:
        for temp in temps:  # OSError: no folder held it (a parent is a file): none written
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
    return path


def read_sidecar(path: Path) -> EngineMeta:
    """The sidecar at ``path``, parsed and checked.

    Raises:
        EngineFileError: unreadable, not UTF-8, not JSON, or not a valid trt_kv sidecar
            (see :meth:`EngineMeta.from_json`); library errors are the cause.
    """
    try:
        text = path.read_bytes().decode("utf-8")
        d = json.loads(text)
    except OSError as err:
        raise EngineFileError(mismatch(str(path), "a readable file", "", err)) from err
    except UnicodeDecodeError as err:
        raise EngineFileError(mismatch(str(path), "UTF-8 text", "", err.reason)) from err
    except json.JSONDecodeError as err:
        raise EngineFileError(mismatch(str(path), "a JSON sidecar", "", err)) from err
    try:
        return EngineMeta.from_json(d)
    except EngineFileError as err:
        raise EngineFileError(f"{path}: {err}") from err


def _state(path: Path) -> str:
    """What stands at ``path`` instead of a file: ``"a folder"`` or ``"missing"``."""
    return "a folder" if path.is_dir() else "missing"


def check_engine_files(path: Path) -> Path:
    """The sidecar path of ``path`` once both files exist.

    Raises:
        EngineFileError: the engine missing (or a folder), naming it; its sidecar missing,
            naming the engine and the sidecar's file name (a file trt_kv did not build, say).
    """
    if not path.is_file():
        raise EngineFileError(mismatch(str(path), "an existing file", "", _state(path)))
    side = sidecar_path(path)
    if not side.is_file():
        what = "an engine built by trt_kv, with its JSON sidecar beside it:"
        raise EngineFileError(mismatch(str(path), what, side.name, _state(side)))
    return side


def load_engine_file(path: Path | str, *, check_version: bool = True) -> tuple[bytes, EngineMeta]:
    """Read an engine and its sidecar; verify size, sha256 and the TensorRT module/version.

    Raises:
        EngineFileError: missing or unreadable file or sidecar; a malformed sidecar (not
            UTF-8, not JSON, a missing, mistyped or inconsistent field, another ``format``);
            size or checksum mismatch (tampered or truncated engine); an engine built by
            another TensorRT module or version.
    """
    path = Path(path)
    meta = read_sidecar(check_engine_files(path))
    try:
        data = path.read_bytes()
    except OSError as err:
        raise EngineFileError(mismatch(str(path), "a readable file", "", err)) from err
    if len(data) != meta.nbytes:
        raise EngineFileError(
            mismatch(str(path), "size in bytes (from the sidecar)", meta.nbytes, len(data))
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta.sha256:
        raise EngineFileError(mismatch(str(path), "sha256 (from the sidecar)", meta.sha256, digest))
    if check_version:
        built_with = (meta.trt_module, meta.trt_version)
        running = (FEATURES.module, FEATURES.version)
        if built_with != running:
            raise EngineFileError(
                mismatch(str(path), "built by the running TensorRT", running, built_with)
            )
    return data, meta


def check_engine_io(engine: object, meta: EngineMeta) -> None:
    """Check a deserialized ``ICudaEngine`` declares exactly the sidecar's I/O: the same
    tensor names, each with its mode (input/output), dtype and shape (-1 = dynamic), and
    each cache output aliased to its sidecar input (``get_aliased_input_tensor``). Run
    before any buffer is sized from the sidecar.

    Plugin engines are exempt from the alias check: TensorRT may not report plugin aliasing
    through ``get_aliased_input_tensor``, so their pairs come from the sidecar alone.

    Raises:
        EngineFileError: naming the tensor and what differs.
    """
    declared = {t.name: ("INPUT", t.dtype, t.shape) for t in meta.inputs}
    declared |= {t.name: ("OUTPUT", t.dtype, t.shape) for t in meta.outputs}
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    if sorted(names) != sorted(declared):
        raise EngineFileError(
            mismatch("engine I/O tensors", "the sidecar's", sorted(declared), sorted(names))
        )
    for name in names:
        actual = (
            engine.get_tensor_mode(name).name,
            dtypes.name_of(engine.get_tensor_dtype(name)),
            tuple(engine.get_tensor_shape(name)),
        )
        if actual != declared[name]:
            raise EngineFileError(
                mismatch(
                    f"engine tensor {name}",
                    "(mode, dtype, shape) of the sidecar",
                    declared[name],
                    actual,
                )
            )
    if meta.cache_update == "plugin":
        return
    for alias in meta.aliases:
        actual = engine.get_aliased_input_tensor(alias.output)
        if actual != alias.input:
            raise EngineFileError(
                mismatch(f"engine output {alias.output}", "aliased input", alias.input, actual)
            )
