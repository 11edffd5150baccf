"""``Broker.log_config`` is asked on every produce and fetch: it parses a topic's configuration once
and hands the same object back until the topic's overrides or the broker's topic defaults change
(replaced or changed in place), then parses afresh."""

from __future__ import annotations

from pathlib import Path

from diskless.broker.broker import Broker
from diskless.cluster.metadata import TopicMetadata
from diskless.config import load_config


def test_log_config_is_parsed_once_and_follows_changes(tmp_path: Path) -> None:
    config = load_config(overrides={"node.id": "1", "log.dirs": str(tmp_path), "log.retention.ms": "5000"})
    broker = Broker(config)
    topic = TopicMetadata("t", "id-1", [], {"retention.bytes": "100"})

    first = broker.log_config(topic)
    assert first.retention_bytes == 100 and first.retention_ms == 5000
    assert broker.log_config(topic) is first  # not parsed again

    topic.configs = {**topic.configs, "retention.bytes": "200"}  # AlterConfigs replaces the dict
    assert broker.log_config(topic).retention_bytes == 200
    topic.configs["retention.bytes"] = "300"  # or changes it in place
    assert broker.log_config(topic).retention_bytes == 300

    config.topic_defaults["log.retention.ms"] = "7000"  # a broker default changes
    assert broker.log_config(topic).retention_ms == 7000
    # Another incarnation under the same name, with its own overrides.
    assert broker.log_config(TopicMetadata("t", "id-2", [], {})).retention_bytes != 300
