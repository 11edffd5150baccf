"""Object storage access for diskless topics: the S3 client layer used by brokers and the WAL manager."""
