"""The target chip an export is drawn for (`tputrace.analysis.target`)."""

from __future__ import annotations

from tputrace.analysis.target import DEFAULT_TARGET, target_chip

__all__ = ["DEFAULT_TARGET", "target_chip"]
