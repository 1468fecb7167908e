"""Which TensorRT parts a decoder network is built from: one route per part, chosen by
:data:`trt_kv._trt.FEATURES` (never by version strings) and recorded in the sidecar.

Parts and their routes, best first:

- attention: ``attention_v2`` (``add_attention_v2``: TensorRT 11, TensorRT-RTX) |
  ``attention`` (``add_attention``, TensorRT >= 10.14: mask, no causal kinds, no key/value
  lengths) | ``primitive`` (matrix multiply, masked float32 softmax, matrix multiply: every
  TensorRT; also the workaround for a fused attention that fails on a given GPU or version);
- rope: ``rotary_layer`` (``add_rotary_embedding``, TensorRT >= 10.15.1) | ``elementwise``
  (rotate-half as a constant gather, cos/sin gathered by position: every TensorRT);
- cache_update: ``layer`` (``IKVCacheUpdateLayer``, TensorRT >= 10.15) | ``plugin``
  (trt_kv's Python ``IPluginV3``: TensorRT 10.x with ``add_plugin_v3``).

``key_value_lengths`` is an option of the fused attention routes (off by default: see
docs/decisions.md). A requested route the installed TensorRT lacks, or a part with no route
at all, raises :class:`RouteError` with the reason of every route tried.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from trt_kv import _trt
from trt_kv._trt import Features
from trt_kv.errors import RouteError, mismatch

AUTO = "auto"

# part -> ((route, Features field it needs or None, what that field stands for), ...), best first
_TABLE: dict[str, tuple[tuple[str, str | None, str], ...]] = {
    "attention": (
        ("attention_v2", "attention_v2", "INetworkDefinition.add_attention_v2"),
        ("attention", "attention", "INetworkDefinition.add_attention"),
        ("primitive", None, ""),
    ),
    "rope": (
        ("rotary_layer", "rotary_embedding", "INetworkDefinition.add_rotary_embedding"),
        ("elementwise", None, ""),
    ),
    "cache_update": (
        ("layer", "kv_cache_update_layer", "INetworkDefinition.add_kv_cache_update"),
        ("plugin", "python_plugins", "INetworkDefinition.add_plugin_v3"),
    ),
}
FUSED_ATTENTION = ("attention_v2", "attention")


@dataclass(frozen=True)
class Routes:
    """The route of each part (``"auto"``: the best one the installed TensorRT has)."""

    attention: str = AUTO
    rope: str = AUTO
    cache_update: str = AUTO
    key_value_lengths: bool = False  # also feed IAttention.key_value_lengths (fused routes)

    def to_json(self) -> dict:
        return asdict(self)

    def key(self) -> str:
        """The settings off their default, e.g. ``"attention_primitive.key_value_lengths"``
        (for engine file names)."""
        parts = []
        for name, value in self.to_json().items():
            if value is True:
                parts.append(name)
            elif value not in (AUTO, False):
                parts.append(f"{name}_{value}")
        return ".".join(parts)

    @classmethod
    def from_json(cls, d: dict) -> Routes:
        return cls(**d)

    @classmethod
    def parse(cls, text: str) -> Routes:
        """``"attention=primitive,rope=elementwise,key_value_lengths"`` -> Routes (parts left
        out stay "auto"; ``key_value_lengths`` alone or ``=true``/``=false``). Route names
        are checked when the routes are resolved.

        Raises:
            RouteError: an unknown part, a part given twice, or a malformed item.
        """
        given: dict[str, object] = {}
        for item in text.split(","):
            name, _, value = (x.strip() for x in item.partition("="))
            if name == "key_value_lengths" and value.lower() in ("", "true", "false"):
                value = value.lower() != "false"
            elif name not in _TABLE or not value:
                parts = (*(f"{p}=ROUTE" for p in _TABLE), "key_value_lengths[=true|false]")
                raise RouteError(mismatch("routes", "items", ",".join(parts), repr(item)))
            if name in given:
                raise RouteError(mismatch("routes", "each part once", "", repr(text)))
            given[name] = value
        return cls(**given)


def route_names(part: str) -> tuple[str, ...]:
    """The routes of ``part`` ("attention", "rope" or "cache_update"), best first."""
    return tuple(name for name, _, _ in _TABLE[part])


def _missing(features: Features, needs: str | None, what: str) -> str | None:
    """Why a route is unavailable, or None when it is available."""
    if needs is None or getattr(features, needs):
        return None
    return f"{features.module} {features.version} has no {what}"


def _resolve(part: str, requested: str, features: Features) -> str:
    table = _TABLE[part]
    names = route_names(part)
    if requested != AUTO and requested not in names:
        raise RouteError(mismatch(f"routes.{part}", "one of", (AUTO, *names), repr(requested)))
    reasons = []
    for name, needs, what in table:
        if requested not in (AUTO, name):
            continue
        why = _missing(features, needs, what)
        if why is None:
            return name
        reasons.append(f"{name}: {why}")
    wanted = "a route the installed TensorRT has" if requested == AUTO else f"route {requested!r}"
    raise RouteError(mismatch(f"routes.{part}", wanted, "", "; ".join(reasons)))


def resolve_routes(requested: Routes | None = None, features: Features | None = None) -> Routes:
    """``requested`` with every ``"auto"`` replaced by the best route ``features`` (default:
    the installed TensorRT's) offer.

    Raises:
        RouteError: an unknown route name; a requested route ``features`` lacks (with the
            reason); a part with no available route (with the reason of each); or
            ``key_value_lengths`` with the primitive route or without
            ``IAttention.key_value_lengths``.
    """
    requested = requested or Routes()
    features = features or _trt.FEATURES
    chosen = replace(
        requested,
        **{part: _resolve(part, getattr(requested, part), features) for part in _TABLE},
    )
    if chosen.key_value_lengths:
        if chosen.attention not in FUSED_ATTENTION:
            raise RouteError(
                mismatch(
                    "routes.key_value_lengths",
                    "a fused attention route",
                    FUSED_ATTENTION,
                    f"{chosen.attention!r} (its explicit mask already bounds the keys)",
                )
            )
        if not features.attention_kv_lengths:
            raise RouteError(
                mismatch(
                    "routes.key_value_lengths",
                    "IAttention.key_value_lengths",
                    "",
                    f"{features.module} {features.version} has none",
                )
            )
    return chosen
