"""One wording of durations, sizes and changes for every view."""

from __future__ import annotations

from tputrace.wording import format_bytes, format_change


def test_a_speed_up_is_times_less_not_a_zero_ratio() -> None:
    assert format_change(44_600.0, 100.0) == "446× less"
    assert format_change(10.0, 21.0) == "2.10× more"
    assert format_change(5, 5) == "same"
    assert format_change(5, 0) == "none after"
    assert format_change(None, 3) == ""


def test_bytes_in_binary_units() -> None:
    assert format_bytes(15232) == "14.9 KiB"
    assert format_bytes(512) == "512 B"
