"""Benchmarks: each module measures and prints figures as ratios to a baseline."""
