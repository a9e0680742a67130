"""Which host and process an XProf `xplane.pb` comes from, so that files of one process import as one rank."""

from __future__ import annotations

from pathlib import Path

from tputrace.importers.wire import XSpaceFile
from tputrace.importers.xstats import plane_stat

# Line times below this (2001 in Unix ns) are relative to the profile's start, not to the epoch.
UNIX_NS_FLOOR = 10**18


def capture_host(path: Path) -> str:
    """The host a capture names: its file name without `.xplane.pb`."""
    return path.name.removesuffix(".xplane.pb")


def process_key(path: Path) -> tuple[str, ...]:
    """Which host and process an `xplane.pb` comes from (its name and the `process_id` stat of its host planes),
    for one whose line times can be put on the Unix clock; the path itself otherwise (nothing to share a rank
    with)."""
    from tputrace.xplane_proto import messages

    plane_class = messages()["XPlane"]
    process_id = profile_start = None
    relative = False
    with XSpaceFile(path) as space:
        for span in space.planes():
            plane, line_spans = space.plane(span, plane_class)
            if plane.name.startswith("/host:") and process_id is None:
                process_id = plane_stat(plane, "process_id")
            if plane.name == "Task Environment":
                profile_start = plane_stat(plane, "profile_start_time")
            relative = relative or any(head.has_events and head.timestamp_ns < UNIX_NS_FLOOR
                                       for head in map(space.line_head, line_spans))
    if process_id is None or (relative and not isinstance(profile_start, int)):
        return (str(path),)
    return capture_host(path), str(process_id)
