"""Delta debugging (Zeller's ddmin): the smallest subset for which a test still holds."""

from __future__ import annotations

import math


def ddmin(items, holds) -> list:
    """Shrink `items` to a 1-minimal subset with holds(subset) True; holds(items) must be True."""
    items = list(items)
    n = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / n)
        chunks = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
        for chunk in chunks:
            subset = [items[i] for i in chunk]
            if holds(subset):
                items, n = subset, 2
                break
        else:
            for chunk in chunks:
                keep = set(chunk)
                complement = [x for i, x in enumerate(items) if i not in keep]
                if complement and len(chunks) > 2 and holds(complement):
                    items, n = complement, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items
