"""What a data-parallel front end did since start: routing decisions and the fault report."""

from __future__ import annotations

from dataclasses import dataclass, field

from cinq.dp.router import REASONS


@dataclass(slots=True)
class DPCounters:
    """What the front end did since start (the figures of the fault report and of /metrics)."""

    num_replicas: int
    retried: int = 0  # sends to a replica that died before the request delivered anything (then re-sent)
    failed: int = 0  # requests ended with an error (replica died mid-stream, no replica left, engine error)
    completed: int = 0  # requests that delivered their finished output
    aborted: int = 0  # requests their consumer gave up on (client gone)
    # completed + failed + aborted: every request a replica accepted that has ended (none is left uncounted)
    restarts: int = 0  # replicas replaced after dying
    decisions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    routed: list[int] = field(default_factory=list)  # sends per replica (retries included)

    def __post_init__(self) -> None:
        self.routed = self.routed or [0] * self.num_replicas

    def summary(self) -> str:
        """The fault report in one line."""
        return (f"{self.completed} completed, {self.failed} failed, {self.aborted} aborted by their client; "
                f"{self.retried} re-sent after a replica died; "
                f"{self.restarts} replica restart(s); routed per replica {self.routed}")
