"""Atomic file output for figures and the report (phub's, so every stage writes the same way)."""
from phub.fileio import atomic_write, write_text

__all__ = ["atomic_write", "write_text"]
