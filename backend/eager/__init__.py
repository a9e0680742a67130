"""Eager modes beyond strict eager: DeferAndFuse's pending graphs, their flushes and what each flush site compiled."""
