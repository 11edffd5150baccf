"""Cluster metadata: topics, partitions, brokers; local file or etcd storage."""
