"""Fault injection for reliability runs: the S3 fault proxy and ``diskless chaos``."""
