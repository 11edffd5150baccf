"""Diskless produce path: the representative buffering batches into WAL objects and committing them."""
