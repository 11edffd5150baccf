"""Diskless: a Kafka-compatible broker whose diskless topics keep record data in object storage."""
