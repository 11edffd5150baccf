"""The broker process: Kafka listener, API handlers, hosted partition logs."""
