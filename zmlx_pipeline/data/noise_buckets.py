"""The kernel-time buckets that repeat spreads are reported and used in (`noise`, the tied regret)."""

from __future__ import annotations

import bisect

#: upper edges in microseconds; a last bucket holds everything from the final edge up
NOISE_BUCKETS_US = (10.0, 50.0, 200.0, 1000.0)


def bucket_index(us: float) -> int:
    """Index of the bucket a time in microseconds falls in (edges belong to the bucket above)."""
    return bisect.bisect_right(NOISE_BUCKETS_US, us)


def bucket_label(index: int) -> str:
    """The bucket's label as `zmlx-pipeline noise` prints it ("0-10 us" ... ">= 1000 us")."""
    edges = (0.0,) + NOISE_BUCKETS_US
    if index < len(NOISE_BUCKETS_US):
        return f"{edges[index]:g}-{NOISE_BUCKETS_US[index]:g} us"
    return f">= {edges[index]:g} us"
