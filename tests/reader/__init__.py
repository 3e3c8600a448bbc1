"""Tests of kiln.reader (a package, so its conftest and helpers do not shadow tests/conftest.py)."""
