"""What a backend is: something that runs one planned step on its cache storage.

Backends are interchangeable, as Polygraphy's runners are: the reference model, the CPU
interpreter, trt_kv's own TensorRT bindings (fast path) and Polygraphy's ``TrtRunner``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from trt_kv.contract import DecoderRoles
from trt_kv.errors import ArgumentError, ClosedError, ConcurrentUseError, mismatch
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.profiles import select_profile
from trt_kv.runtime.storage import CacheStorage

# a step's next-token candidates: ids [B, k] int32 best first, and their logits [B, k]
# float32 (None when k = 1: greedy needs none)
Candidates = tuple[np.ndarray, np.ndarray | None]


class Backend(Protocol):
    """What :class:`~trt_kv.runtime.session.Session` needs of a backend (a user's own too):
    ``storage``, ``max_step_tokens``, ``vocab_size`` and ``run`` (:data:`REQUIRED`).
    ``name`` is for display (trt_kv's backends and the CLI have one). Optional, each treated
    as absent when missing: ``long_rope_after`` (None: no longrope re-prefill, ever);
    ``closed`` (True once the backend's ``close()`` ran: every session operation then raises
    :class:`~trt_kv.errors.ClosedError` before changing anything); ``check_plan(plan)``
    (raise what ``run(plan)`` would refuse for the step's shapes, e.g. a batch no
    optimization profile holds, changing nothing: a prefill calls it before any slot is
    reset).

    Optional, sampling on the device (a network built with ``device_top_k`` = k >= 1):
    ``device_top_k`` (k; absent or 0: none) and ``run_top_k(plan)``, which runs the step as
    ``run`` does but returns the k candidates instead of the logits (see
    :func:`top_k_candidates`); :func:`~trt_kv.runtime.generate.generate` uses them where its
    sampler allows (:meth:`~trt_kv.runtime.sampling.Sampler.takes_candidates`). A backend
    without them gets the logits path, unchanged.

    One thread at a time: trt_kv's backends run ``run``, ``run_top_k`` and ``close`` under
    :func:`one_thread`, on the guard their sessions share (:func:`guard_of`), so a step or a
    close from a second thread while one is in flight raises
    :class:`~trt_kv.errors.ConcurrentUseError`; a user's backend may do the same."""

    name: str
    storage: CacheStorage
    max_step_tokens: int  # most new tokens per sequence in one step (S bound)
    vocab_size: int
    # the length past which generate prefills a sequence again (longrope's
    # original_max_position_embeddings when S_max can pass it), else None. Optional.
    long_rope_after: int | None
    closed: bool  # optional
    device_top_k: int  # optional: k of run_top_k's candidates (0 or absent: no run_top_k)

    def check_plan(self, plan: StepPlan) -> None:  # optional
        """Raise (ShapeError...) what :meth:`run` would refuse for ``plan``; change nothing."""
        ...

    def run(self, plan: StepPlan) -> np.ndarray:
        """Run ``plan`` on ``storage`` (caches updated in place); logits ``[B, V]`` float32."""
        ...

    def run_top_k(self, plan: StepPlan) -> Candidates:  # optional
        """Run ``plan`` as :meth:`run`; the candidates ``(ids [B, k], logits [B, k] or
        None)`` of :func:`top_k_candidates`."""
        ...


REQUIRED = ("storage", "max_step_tokens", "vocab_size", "run")


def check_backend(backend: object) -> None:
    """Raise ArgumentError naming every :data:`REQUIRED` attribute ``backend`` lacks."""
    missing = [a for a in REQUIRED if not hasattr(backend, a)]
    if missing:
        raise ArgumentError(
            mismatch(
                "backend",
                f"a backend with {', '.join(REQUIRED)}",
                "",
                f"{type(backend).__name__} without {', '.join(missing)}",
            )
        )


@dataclass
class Guard:
    """One backend's lock, shared by its sessions and its own steps, and the operation that
    holds it (``"Session.decode"``, ``"TrtBackend.run"``: for the message)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    holder: str = ""


_GUARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> Guard


def guard_of(backend: object) -> Guard:
    """The guard of ``backend`` (a backend that cannot be weakly referenced gets a new one
    per call: its caller keeps it)."""
    try:
        return _GUARDS.setdefault(backend, Guard())
    except TypeError:
        return Guard()


@contextmanager
def exclusive(guard: Guard, operation: str) -> Iterator[None]:
    """Hold ``guard`` for ``operation`` (the same thread may nest: a session's step holds
    it, then its backend's ``run``). One thread at a time: it neither waits nor serializes.

    Raises:
        ConcurrentUseError: another thread holds it, naming both operations.
    """
    if not guard.lock.acquire(blocking=False):
        raise ConcurrentUseError(
            mismatch(
                operation, "one thread at a time", "", f"another thread in {guard.holder or '?'}"
            )
        )
    outer, guard.holder = guard.holder, guard.holder or operation
    try:
        yield
    finally:
        guard.holder = outer
        guard.lock.release()


F = TypeVar("F", bound=Callable)


def held(hold: Callable[[Any, str], AbstractContextManager]) -> Callable[[F], F]:
    """A decorator: the method runs inside ``hold(self, the method's name)``."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: object, *args: object, **kwargs: object) -> object:
            with hold(self, method.__name__):
                return method(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def _backend_held(backend: object, method: str) -> AbstractContextManager:
    return exclusive(guard_of(backend), f"{type(backend).__name__}.{method}")


# Run a backend's method (a step, its close) under :func:`exclusive` on the backend's guard,
# named ``Type.method``: a second thread's step, or a close during a step, raises
# ConcurrentUseError instead of mixing two steps' inputs in one set of bindings and buffers.
one_thread = held(_backend_held)


def check_open(backend: str, closed: bool) -> None:
    """:class:`~trt_kv.errors.ClosedError` naming ``backend`` for a step after its close()."""
    if closed:
        raise ClosedError(mismatch(backend, "an open backend", "", "closed"))


def plan_profile(backend: object, plan: StepPlan) -> int:
    """``check_plan`` of trt_kv's backends: the profile that runs ``plan``
    (``backend.step_profile``), once ``backend`` is open (``closed``, where it has one) and
    the step's embeddings pass (``backend.embed``, for a network of embeddings); changes
    nothing.

    Raises:
        ClosedError: the backend is closed. ShapeError: no profile holds the step's shapes.
        As :class:`~trt_kv.runtime.embedding.StepEmbedder`: bad embeddings.
    """
    check_open(type(backend).__name__, getattr(backend, "closed", False))
    profile = backend.step_profile(plan)
    if backend.embed is not None:
        backend.embed(plan)
    return profile


def step_feed(
    plan: StepPlan, roles: DecoderRoles, embed: Callable[[StepPlan], np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """The non-cache inputs of a step: each input of ``roles`` (the network's decoder
    contract, :mod:`trt_kv.contract`) with the :class:`StepPlan` array of its role;
    the ``embeddings`` role with ``embed(plan)`` (a backend's
    :class:`~trt_kv.runtime.embedding.StepEmbedder`: ``[B, S, D]`` from the step's ids).

    Raises:
        ArgumentError: an embeddings network and no ``embed``.
        DTypeError, ShapeError, ArgumentError: as :class:`StepEmbedder` (bad embeddings).
    """
    feed = {name: getattr(plan, attr) for name, attr in roles.feed_names().items()}
    if roles.token_role == "embeddings":
        if embed is None:
            raise ArgumentError(mismatch("embed", "a function for embeddings", "", None))
        feed[roles.inputs["embeddings"]] = embed(plan)
    return feed


def step_shapes(plan: StepPlan, roles: DecoderRoles, storage: CacheStorage) -> dict:
    """The shape of every input of a step: the non-cache ones (:func:`step_feed`,
    ``[B, S, D]`` for embeddings) and each cache window ``[B, N, S_max, H]``."""
    shapes = {name: getattr(plan, attr).shape for name, attr in roles.feed_names().items()}
    if roles.token_role == "embeddings":
        shapes[roles.inputs["embeddings"]] += (roles.embedding_dim,)
    window = (len(plan.counts), *storage.slot_shape)
    shapes.update({a.input: window for a in storage.aliases})
    return shapes


class StepProfiles:
    """The optimization profile of a step, chosen once per step shape ``(B, S)`` (every
    input's shape follows from it): a step's check costs a lookup.

    Raises (on call):
        ShapeError: no profile holds the step's shapes (as :func:`select_profile`).
    """

    def __init__(self, profiles: list, roles: DecoderRoles, storage: CacheStorage) -> None:
        self.profiles, self.roles, self.storage = profiles, roles, storage
        self._chosen: dict[tuple[int, int], int] = {}

    def __call__(self, plan: StepPlan) -> int:
        key = plan.input_ids.shape
        chosen = self._chosen.get(key)
        if chosen is None:
            shapes = step_shapes(plan, self.roles, self.storage)
            chosen = self._chosen[key] = select_profile(self.profiles, shapes)
        return chosen


def take_roles(backend: object, roles: DecoderRoles) -> None:
    """Set what a session reads of a backend from its network's ``roles``: ``roles``,
    ``max_step_tokens``, ``vocab_size``, ``long_rope_after``."""
    backend.roles = roles
    backend.max_step_tokens, backend.vocab_size = roles.max_step_tokens, roles.vocab_size
    backend.long_rope_after = roles.long_rope_after
    backend.device_top_k = roles.device_top_k


def check_top_k(roles: DecoderRoles) -> tuple[str, ...]:
    """The sampling outputs' names; ArgumentError for a network without them (a backend's
    ``run_top_k`` calls it before it runs anything)."""
    names = roles.sampling_outputs()
    if not names:
        raise ArgumentError(
            mismatch("network", "one built with device_top_k >= 1", "", roles.device_top_k)
        )
    return names


def candidates_of(backend: object) -> int:
    """The ``k`` of a backend's next-token candidates: its ``device_top_k`` where it also
    has ``run_top_k`` (both optional, see :class:`Backend`), else 0."""
    k = getattr(backend, "device_top_k", 0)
    ok = isinstance(k, int) and not isinstance(k, bool) and k >= 1
    return k if ok and callable(getattr(backend, "run_top_k", None)) else 0


def top_k_candidates(outputs: Mapping[str, np.ndarray], roles: DecoderRoles) -> Candidates:
    """A step's candidates from the network's sampling outputs (``roles.device_top_k`` =
    k >= 1): ``(next_token [B] as [B, 1], None)``, or ``(top_ids [B, k], top_logits [B, k])``.

    Raises:
        ArgumentError: a network without them (k = 0).
    """
    k, names = roles.device_top_k, check_top_k(roles)
    ids = np.asarray(outputs[names[0]]).reshape(-1, k)
    return ids, (np.asarray(outputs[names[1]]).reshape(-1, k) if len(names) == 2 else None)


def last_token_logits(logits: np.ndarray, plan: StepPlan) -> np.ndarray:
    """``[B, V]`` float32 from ``[B, V]`` or all-position ``[B, S, V]`` logits."""
    if logits.ndim == 3:
        logits = logits[np.arange(len(plan.counts)), plan.counts - 1]
    return np.asarray(logits, dtype=np.float32)
