"""Progress bars for the tools' long steps (hashing weights, lowering many parts), through `tqdm`.

A bar shows only when standard error is a terminal and the step outlasts a second (tqdm's `delay`); otherwise
nothing is written, so logs, pipes and tests see no escape codes. Library code takes a `Progress` and calls
`over` for a loop or `bytes` for a stream; `Progress.silent()` is the one that never shows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

DELAY_S = 1.0  # a step shorter than this shows no bar


@dataclass(frozen=True)
class Progress:
    """Where progress is shown: on standard error when `live`, nowhere otherwise."""

    live: bool

    @classmethod
    def on_terminal(cls) -> Progress:
        """Live when standard error is a terminal."""
        return cls(live=sys.stderr.isatty())

    @classmethod
    def silent(cls) -> Progress:
        return cls(live=False)

    def over(self, items: Iterable[T], what: str, total: int | None = None) -> Iterator[T]:
        """`items`, one by one, counted on a bar labelled `what`."""
        if not self.live:
            yield from items
            return
        from tqdm import tqdm

        with tqdm(items, desc=what, total=total, delay=DELAY_S, leave=False, file=sys.stderr) as bar:
            yield from bar

    def bytes(self, total: int, what: str) -> Callable[[int], None]:
        """A function to call with each block's size as `total` bytes are read."""
        if not self.live:
            return _ignore
        from tqdm import tqdm

        bar = tqdm(total=total, desc=what, unit="B", unit_scale=True, delay=DELAY_S, leave=False, file=sys.stderr)

        def advance(count: int) -> None:
            bar.update(count)
            if bar.n >= total:
                bar.close()

        return advance


def _ignore(count: int) -> None:
    """No bar to advance."""
