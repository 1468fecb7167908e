"""Which TensorRT module runs engines on which GPU compute capability: a table of data, and
the questions asked of it (does this module, this engine, run on this GPU; what would).

A compute capability is ``(major, minor)``; an engine's targets are ``()`` for a portable
engine (TensorRT-RTX's default: no ``IBuilderConfig.set_compute_capability`` call), else the
capabilities it was built for. Imports nothing heavy: ``trt-kv --version`` and the backend
choice read it before TensorRT or CUDA is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from trt_kv.errors import ArgumentError, mismatch

CC = tuple[int, int]
PORTABLE = "portable"  # the sidecar's and the build option's word for "no explicit targets"


@dataclass(frozen=True)
class ModuleSupport:
    """What engines of one TensorRT module (``module``, versions starting ``version``) run
    on. ``portable``: capabilities a portable engine runs on, and ``at_least``: every one
    from there up (None: no more); ``targets``: ``ComputeCapability`` member -> capability,
    the explicit build targets (empty: the module builds for the GPU it runs on).
    ``install``: what to install to get it; ``source``: where these facts come from."""

    module: str
    version: str
    portable: tuple[CC, ...]
    at_least: CC | None
    targets: dict[str, CC]
    install: str
    source: str

    def runs_portable(self, cc: CC) -> bool:
        return cc in self.portable or (self.at_least is not None and cc >= self.at_least)


_FULL_TRT_SOURCE = (
    "TensorRT 10.x support matrix (docs.nvidia.com/deeplearning/tensorrt/latest/"
    "getting-started/support-matrix.html): Turing (7.5) through Blackwell, Hopper (9.0) "
    "included; an engine runs on the capability of the GPU that built it (no hardware "
    "compatibility level set)"
)

SUPPORT: tuple[ModuleSupport, ...] = (
    ModuleSupport(
        module="tensorrt_rtx",
        version="1.7",
        portable=((8, 0), (8, 6), (8, 9), (12, 0), (12, 1)),
        at_least=(12, 0),
        targets={
            "SM75": (7, 5),
            "SM80": (8, 0),
            "SM86": (8, 6),
            "SM89": (8, 9),
            "SM120": (12, 0),
            "SM121": (12, 1),
        },
        install="TensorRT-RTX (pip install tensorrt-rtx)",
        source="TensorRT-RTX 1.7.1 on an NVIDIA H200, 2026-11-25 (docs/gpu-results.md): "
        "'The engine cannot run on this GPU, which has compute capability 9.0. Supported "
        "compute capabilities: 8.0 8.6 8.9 12.0 12.1 >12.0.'; the members of its "
        "trt.ComputeCapability (SM75 SM80 SM86 SM89 SM120 SM121: no SM90)",
    ),
    *(
        ModuleSupport(
            module="tensorrt",
            version=major,
            portable=(),
            at_least=(7, 5),
            targets={},
            install="TensorRT >= 10.15 (pip install tensorrt-cu12 / tensorrt-cu13)",
            source=_FULL_TRT_SOURCE,
        )
        for major in ("10", "11")
    ),
)

ARCHITECTURES = {7: "Turing", 8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


def cc_text(cc: CC) -> str:
    """``(9, 0)`` -> ``"9.0"``."""
    return f"{cc[0]}.{cc[1]}"


def support_of(module: str, version: str) -> ModuleSupport | None:
    """The row of ``module`` at ``version`` (``"1.7.1.116"`` matches ``"1.7"``), else the row
    of that module whose version is nearest (an unmeasured release is taken to run what its
    neighbour runs, and :func:`refusal` says so); None for a module the table does not know
    (the check is then skipped: nothing is known to refuse)."""
    rows = [row for row in SUPPORT if row.module == module]
    for row in rows:
        if version == row.version or version.startswith(row.version + "."):
            return row
    return min(rows, key=lambda row: _distance(row.version, version), default=None)


def is_measured(module: str, version: str) -> bool:
    """Whether the table has a row for exactly this release (not a neighbour's)."""
    row = support_of(module, version)
    return row is not None and (version == row.version or version.startswith(row.version + "."))


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _distance(a: str, b: str) -> tuple[int, ...]:
    """How far release ``a`` is from ``b``, part by part (major first)."""
    x, y = _numbers(a), _numbers(b)
    n = max(len(x), len(y))
    x, y = x + (0,) * (n - len(x)), y + (0,) * (n - len(y))
    return tuple(abs(i - j) for i, j in zip(x, y))


def parse_targets(
    text: str, module: str, version: str, option: str = "compute_capability"
) -> tuple[CC, ...]:
    """``--compute-capability`` / ``BuildOptions.compute_capability``: ``"portable"`` ->
    ``()``, ``"8.9"`` or ``"8.0,12.0"`` -> those capabilities, each one the module can target.

    Raises:
        ArgumentError: naming ``option``, the module's targets and the text.
    """
    if text == PORTABLE:
        return ()
    row = support_of(module, version)
    known = {cc_text(cc): cc for cc in (row.targets.values() if row else ())}
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else [text]
    wrong = [p for p in parts if p not in known]
    if wrong or not parts:
        where = f"{module} {version}"
        choices = [PORTABLE, *known] if known else [PORTABLE]
        raise ArgumentError(
            mismatch(option, f"one of {choices} (or a comma list) for", where, repr(text))
        )
    return tuple(sorted({known[p] for p in parts}))


def engine_runs(cc: CC, targets: tuple[CC, ...], module: str, version: str) -> bool | None:
    """Whether an engine of ``module``/``version`` built for ``targets`` (``()``: portable)
    runs on a GPU of capability ``cc``; None when the table does not know the module."""
    row = support_of(module, version)
    if row is None:
        return None
    return cc in targets if targets else row.runs_portable(cc)


def what_runs(cc: CC) -> str:
    """What to install for ``cc``: the first other row whose engines run on it."""
    for row in SUPPORT:
        if row.runs_portable(cc):
            arch = ARCHITECTURES.get(cc[0])
            return f"install {row.install}" + (f" for {arch}" if arch else "")
    return "no TensorRT module trt_kv knows runs it"


def refusal(
    cc: CC,
    gpu: str,
    module: str,
    version: str,
    targets: tuple[CC, ...] = (),
    engine: str | None = None,
) -> str | None:
    """Why TensorRT engines cannot run on this GPU, in one line; None when they can (or
    when the table does not know ``module``). ``engine`` and ``targets``: an engine file's
    name and explicit targets, checked after the module itself.

    e.g. ``GPU compute capability 9.0 (NVIDIA H200): TensorRT-RTX 1.7.1 does not run it;
    install TensorRT >= 10.15 (pip install tensorrt-cu12 / tensorrt-cu13) for Hopper``.
    """
    row = support_of(module, version)
    if row is None:
        return None
    head = f"GPU compute capability {cc_text(cc)} ({gpu})"
    name = f"{'TensorRT-RTX' if module == 'tensorrt_rtx' else 'TensorRT'} {_short(version)}"
    if not is_measured(module, version):
        name += f" (as {row.version}, the nearest release trt_kv knows)"
    can_target = cc in row.targets.values()
    if not row.runs_portable(cc) and not can_target:
        return f"{head}: {name} does not run it; {what_runs(cc)}"
    if engine_runs(cc, targets, module, version):
        return None
    built = "portable" if not targets else "built for " + " ".join(cc_text(t) for t in targets)
    fix = f"--compute-capability {cc_text(cc)}" if can_target else "--compute-capability portable"
    return f"{head}: {engine or 'the engine'} is {built}, not for it; rebuild it with {fix}"


def _short(version: str) -> str:
    """``"1.7.1.116"`` -> ``"1.7.1"``."""
    return ".".join(version.split(".")[:3])
