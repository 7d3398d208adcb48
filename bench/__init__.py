"""Benchmarks: one command each, a table printed, figures measured side by side in one run."""
