"""Comparing runs: the figures of one run (`figures`), the difference between two (`diff`), and budgets
a run must keep (`tputrace.budgets`)."""
