"""A step's embeddings, for a network whose token role is ``embeddings`` (``[B, S, D]``).

The runtime plans with token ids (positions, lengths and write indices follow from their
count); a backend of an embeddings network turns each step's ids into the network's input
with the ``embed`` function its user gives it, checked before anything runs:

    backend = InterpreterBackend(net, embed=lambda ids: table[ids])  # ids [B, S] int32

``embed(ids)`` gets the step's ids ``[B, S]`` int32, right-padded with 0 like ``token_ids``,
and returns ``[B, S, D]`` NumPy values of the network's embeddings dtype (D and the dtype are
in the role map: ``embedding_dim``, ``embedding_dtype``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trt_kv import dtypes
from trt_kv.contract import DecoderRoles
from trt_kv.errors import ArgumentError, DTypeError, ShapeError, mismatch
from trt_kv.runtime.cache_state import StepPlan

EmbedFn = Callable[[np.ndarray], np.ndarray]  # ids [B, S] int32 -> [B, S, D]


class StepEmbedder:
    """``embed`` checked: each step's embeddings ``[B, S, D]`` of the roles' dtype, all
    finite. The last step's are kept, so that a backend's ``check_plan`` (which a session
    calls before it resets any slot) and its ``run`` of the same plan call ``embed`` once (a
    chunked prefill checks every chunk before it runs the first: twice per chunk)."""

    def __init__(self, roles: DecoderRoles, embed: EmbedFn) -> None:
        self.name = roles.inputs["embeddings"]
        self.dim, self.dtype = roles.embedding_dim, dtypes.to_numpy(roles.embedding_dtype)
        self.embed = embed
        self._last: tuple[StepPlan, np.ndarray] | None = None

    def __call__(self, plan: StepPlan) -> np.ndarray:
        """The embeddings of ``plan``'s ids.

        Raises:
            DTypeError: ``embed`` returned no NumPy array, or one of another dtype.
            ShapeError: one of another shape than ``[B, S, D]``.
            ArgumentError: one holding NaN or infinite values.
        """
        if self._last is not None and self._last[0] is plan:
            return self._last[1]
        ids = plan.input_ids
        what = f"embed(ids {list(ids.shape)}) for {self.name}"
        out = self.embed(ids)
        if not isinstance(out, np.ndarray):
            raise DTypeError(mismatch(what, "a NumPy array", "", type(out).__name__))
        want = (*ids.shape, self.dim)
        if out.shape != want:
            raise ShapeError(mismatch(what, "shape", list(want), list(out.shape)))
        if out.dtype != self.dtype:
            raise DTypeError(mismatch(what, "dtype", self.dtype.name, out.dtype.name))
        bad = int(np.size(out) - np.count_nonzero(np.isfinite(out)))
        if bad:
            raise ArgumentError(mismatch(what, "finite values", "", f"{bad} NaN or infinite"))
        self._last = (plan, out)
        return out


def step_embedder(roles: DecoderRoles, embed: EmbedFn | None) -> StepEmbedder | None:
    """The checked ``embed`` of a backend of a network with ``roles``: a
    :class:`StepEmbedder` for an ``embeddings`` network, None for one of ``token_ids``.

    Raises:
        ArgumentError: ``embed`` missing for an embeddings network, given for a network of
            token ids, or not callable.
    """
    name = roles.inputs.get("embeddings")
    if name is None:
        if embed is not None:
            ids = roles.inputs["token_ids"]
            raise ArgumentError(
                mismatch("embed", f"None for a network of token ids ({ids})", "", repr(embed))
            )
        return None
    if not callable(embed):
        want = f"ids [B, S] int32 -> [B, S, {roles.embedding_dim}] {roles.embedding_dtype}"
        raise ArgumentError(
            mismatch("embed", f"a function {want} for the embeddings input {name}", "", embed)
        )
    return StepEmbedder(roles, embed)
