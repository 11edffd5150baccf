"""``diskless bench``: latency, throughput and cost figures of a local 3-AZ cluster, with targets.

One run starts a 3-broker, 3-AZ cluster on the embedded S3 server and etcd (``cluster``), measures
the raw S3 server first (``s3_baseline``), then drives a diskless and a classic topic in turn with
load-generator processes, one producer and one consumer per AZ (``loadgen``), while ``collect``
samples the brokers (/proc and their Prometheus endpoints). ``stats`` turns the raw samples into
per-phase figures, ``report`` checks them against issue 10's targets and writes JSON, Markdown and
PNG plots; ``runner`` orders all of it and shows progress.
"""
