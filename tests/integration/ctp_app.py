"""A consume-transform-produce application (confluent-kafka, transactions), run as its own
process by test_transactions.py so the test can restart it like a supervisor would.

Usage: python ctp_app.py BOOTSTRAP PROGRESS_FILE
Reads ctp-in with read_committed, writes ctp-out in transactions that also commit the consumed
offsets, and writes the number of records it has committed to PROGRESS_FILE after each commit.
"""

from __future__ import annotations

import os
import sys

from confluent_kafka import Consumer, KafkaException, Producer


def main(bootstrap: str, progress_file: str) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "transformer",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(["ctp-in"])
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": "transformer-1", "transaction.timeout.ms": 10000}
    )
    producer.init_transactions(60)
    committed = 0
    while True:
        messages = [m for m in consumer.consume(200, 1.0) if m.error() is None]
        if not messages:
            continue
        try:
            producer.begin_transaction()
            for m in messages:
                producer.produce("ctp-out", key=m.key(), value=m.value().replace(b"in-", b"out-"))
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
        except KafkaException as exc:
            if exc.args[0].txn_requires_abort():
                producer.abort_transaction(60)
                # Rewind to the committed offsets: the aborted records must be processed again.
                for tp in consumer.committed(consumer.assignment(), 30):
                    if tp.offset >= 0:
                        consumer.seek(tp)
                continue
            return 1  # fatal (fenced, ...): the supervisor starts a new instance
        committed += len(messages)
        tmp = progress_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(committed))
        os.replace(tmp, progress_file)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
