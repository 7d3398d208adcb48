"""What a request holds while it runs (a worker's in-flight slot, a place in admission's queue,
quota tokens not yet settled, a peer's probe, a pooled connection), taken with `with` in the
function that takes it, so that every exit gives it back once: success, an error, cancellation,
a client that leaves, an exception nobody expected.

A holder ends it early where it knows more (a worker that failed, an answer that finished);
the exit then has nothing left to do. `error` tells the release how the block ended.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Held:
    __slots__ = ("released",)

    def __init__(self) -> None:
        self.released = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.released:
            self.released = True
            self.release(error)

    def release(self, error: BaseException | None) -> None:
        """Give back what is held; `error` is what ended the block, None for a normal end."""
        raise NotImplementedError

    def settled(self) -> None:
        """Its holder gave it back in its own way: the exit leaves it alone."""
        self.released = True
