"""Partition logs: segments, indexes, leader epochs, retention, recovery."""
