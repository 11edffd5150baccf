"""Tiering: committed WAL ranges of diskless partitions moved into per-partition segment objects."""
