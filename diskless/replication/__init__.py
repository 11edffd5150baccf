"""Replication of partition logs: leader-side follower tracking and follower fetchers."""
