"""Moved to :mod:`validation.atomic` (validation must not import bench_compare). This re-export keeps branches written
before the move importing; new code imports ``validation.atomic``."""

from validation.atomic import atomic_open, atomic_write_bytes, atomic_write_json, atomic_write_text  # noqa: F401
