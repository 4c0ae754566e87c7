"""A target step's seconds as a function of the rows it computes, from a start-up profile
(cinq/engine/step_profile.py): what adaptive k (cinq/spec/adaptive.py) prices a verify step's rows by."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class RowCurve:
    """Measured (rows, seconds) points, non-decreasing; linear between them, flat below the first, and in
    proportion to rows past the last (a step that large is compute-bound)."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, measured: dict[int, float]) -> RowCurve:
        """The curve through ``measured`` (rows -> seconds), each point at most the ones after it (a step computing
        fewer rows costs no more: a higher reading is noise, such as the first steps' warm-up)."""
        if not measured or any(r < 1 or s <= 0 for r, s in measured.items()):
            raise ValueError(f"row curve: need positive rows and seconds, got {measured!r}")
        rows = tuple(sorted(measured))
        seconds, low = [], float("inf")
        for r in reversed(rows):
            low = min(low, measured[r])
            seconds.append(low)
        return cls(rows, tuple(reversed(seconds)))

    def __call__(self, rows: float) -> float:
        if rows >= self.rows[-1]:
            return self.seconds[-1] * rows / self.rows[-1]
        i = bisect.bisect_right(self.rows, rows)
        if i == 0:
            return self.seconds[0]
        r0, r1, s0, s1 = self.rows[i - 1], self.rows[i], self.seconds[i - 1], self.seconds[i]
        return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
