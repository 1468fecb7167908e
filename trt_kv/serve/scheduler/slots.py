"""Which request holds each cache slot, and what a free slot still has cached (prefix
reuse: the next turn of a chat finds its history there and prefills only the rest)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class SlotTable:
    """``capacity`` slots, each free or held; ``cached[slot]``: the token ids its cache holds
    (rows ``0 .. len - 1``), kept when it is freed."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = [False] * capacity
        self.cached: list[list[int]] = [[] for _ in range(capacity)]

    @property
    def free(self) -> int:
        return self.held.count(False)

    def take(self, prompt: Sequence[int], n: int) -> tuple[list[int], int]:
        """Hold ``n`` free slots for a request of ``prompt``: first the free slot whose
        cached tokens share the longest prefix with ``prompt`` (at most ``len(prompt) - 1``
        tokens: one is always fed, for its logits; ties and no match: the lowest slot), then
        the lowest free ones. Returns the slots and the reused prefix length; the caller
        crops the first slot's cache to it. The caller checks :attr:`free` >= ``n``."""
        free = [s for s in range(self.capacity) if not self.held[s]]
        reuse = {s: min(common_prefix(self.cached[s], prompt), len(prompt) - 1) for s in free}
        first = max(free, key=lambda s: (reuse[s], -s))
        slots = [first, *[s for s in free if s != first][: n - 1]]
        for s in slots:
            self.held[s] = True
        self.cached[first] = list(prompt[: reuse[first]])
        return slots, reuse[first]

    def release(self, slot: int, cached: Sequence[int]) -> None:
        """Free ``slot``, its cache holding ``cached`` (``[]`` after a reset)."""
        self.held[slot] = False
        self.cached[slot] = list(cached)
