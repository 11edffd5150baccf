"""Kafka wire protocol: framing, request/response codec, record batch headers."""
