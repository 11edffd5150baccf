"""Diskless fetch path: turning pointer entries into record batches from object storage."""
