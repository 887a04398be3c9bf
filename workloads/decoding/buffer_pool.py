"""Buffers lent to one decode at a time and kept for the next request of the same shape.

xGR's buffer reuse (section 6.3): a decode of a given (batch, beam width, model) shape writes into
storage allocated once; the pool hands it out and takes it back. One pool lives in each
`DecoderContext` (one per process), so buffers are shared by every decoder object built from it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class BufferPool:
    """Buffers by shape key, lent to one decode at a time and kept for the next request of that shape.

    `acquire(key, build)` returns a free buffer of that key (or `build()`s one); `release` returns it.
    At most `max_keys` shapes are kept (least recently used dropped); thread-safe."""

    def __init__(self, max_keys: int = 8, max_free_per_key: int = 2) -> None:
        self.max_keys, self.max_free = max_keys, max_free_per_key
        self._free: OrderedDict[Hashable, list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.built = 0  # buffers built (a reused one is not counted again)

    def acquire(self, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            free = self._free.get(key)
            if free:
                self._free.move_to_end(key)
                return free.pop()
            self.built += 1
        return build()

    def release(self, key: Hashable, value: Any) -> None:
        with self._lock:
            free = self._free.setdefault(key, [])
            self._free.move_to_end(key)
            if len(free) < self.max_free:
                free.append(value)
            while len(self._free) > self.max_keys:
                self._free.popitem(last=False)
