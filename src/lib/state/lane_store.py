"""The upload lane's statements (image_archive_lane): its pause and its upload log."""

from __future__ import annotations

from datetime import datetime

from lib.state.lane import LaneState, lane_state
from lib.state.queries import Statements


class LaneStore(Statements):
    def state(self) -> LaneState:
        [row] = self._run("lane_state")
        return lane_state(row)

    def pause(self, *, until: datetime | str, reason: str, window: str | None, detail: str) -> None:
        self._run("pause_lane", until=until, reason=reason, window=window, detail=detail)

    def clear(self, *, reason: str | None = None) -> str | None:
        """Open the lane; returns the reason of the pause cleared, None if it was open."""
        rows = self._run("clear_pause", reason=reason)
        return str(rows[0][0]) if rows else None

    def reserve_upload(
        self, *, version: int, upload_times: list[datetime], closed_until: datetime | None
    ) -> bool:
        """Write the lane's new upload log (and a pacing pause) if nobody changed it since
        `version`; False: read it again and decide again."""
        rows = self._run(
            "reserve_upload",
            version=version,
            upload_times=upload_times,
            closed_until=closed_until,
        )
        return bool(rows)
