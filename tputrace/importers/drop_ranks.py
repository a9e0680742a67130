"""Taking ranks out of a written import: the captures of other runs found in one directory (`separate_runs`) are left
out of the trace after it is written, so that the directory is read once, not again without them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tputrace.derived.imported_sources import IMPORTED_META_KEY


def drop_ranks(trace: Path, dropped: set[int]) -> int:
    """Delete the rows of the `dropped` ranks from every table with a `rank` column and from `meta.imported`, and
    number the ranks left 0.. in their order; how many of their rows (other than their `runs` rows) were deleted."""
    connection = sqlite3.connect(trace)
    try:
        tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                  if any(column == "rank" for (column,) in connection.execute(
                      "SELECT name FROM pragma_table_info(?)", (name,)))]
        (meta,) = connection.execute("SELECT value FROM meta WHERE key = ?", (IMPORTED_META_KEY,)).fetchone()
        sources = [source for source in json.loads(meta) if source["rank"] not in dropped]
        renumbered = {source["rank"]: number for number, source in enumerate(sources)}
        deleted = 0
        marks = ", ".join("?" * len(dropped))
        for table in tables:
            rows = connection.execute(f"DELETE FROM {table} WHERE rank IN ({marks})", sorted(dropped)).rowcount
            deleted += rows if table != "runs" else 0  # a rank's run row is no row the import counts
            # Ascending: each rank moves down to a number already freed.
            for old, new in sorted(renumbered.items()):
                if old != new:
                    connection.execute(f"UPDATE {table} SET rank = ? WHERE rank = ?", (new, old))
        for source in sources:
            source["rank"] = renumbered[source["rank"]]
        connection.execute("UPDATE meta SET value = ? WHERE key = ?",
                           (json.dumps(sources, sort_keys=True), IMPORTED_META_KEY))
        connection.commit()
    finally:
        connection.close()
    return deleted
