"""Benchmarks: baton beside the physical limits and beside the Hugging Face Trainer (`make bench`).

Every figure is a ratio of two things measured side by side in the same run, interleaved, medians of
repeats. Nothing here asserts on time; `python -m bench.run` prints a table and writes docs/results.md.
"""
