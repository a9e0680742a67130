"""Data-dependent shapes and indexing: `nonzero`/`unique`-like ops and masks read without a program per
length (padded buffers cut to their length), index checks, and packed sequences."""
