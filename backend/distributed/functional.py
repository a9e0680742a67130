"""Placeholder."""
def register() -> None:
    pass
