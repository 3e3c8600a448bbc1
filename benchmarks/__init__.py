"""kiln's benchmarks: `python -m benchmarks.run` (or `make bench`) writes BENCHMARKS.md.

Not tests: nothing here asserts a timing. See `benchmarks.run` for the
command line and what each measurement means.
"""
