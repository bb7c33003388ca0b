"""Binary searches over a condition that holds on one side of a point: the fit planner's layers and experts,
chat's compaction (how many lines one summary request holds)."""

from __future__ import annotations

from collections.abc import Callable


def least(lo: int, hi: int, ok: Callable[[int], bool], default: int) -> int:
    """The least k in lo..hi with ok(k) (ok is monotone: false, then true), else default."""
    if not ok(hi):
        return default
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def most(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The most k in lo..hi with ok(k) (monotone: true, then false); lo where none."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
