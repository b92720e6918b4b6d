"""Backends (filled in by the next step)."""
