"""Standalone kiln commands: lint, verify, inspect and preview."""
