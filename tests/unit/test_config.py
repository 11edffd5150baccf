"""Broker configuration: properties file < environment < overrides, with validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from diskless.config import BrokerConfig, Endpoint, env_properties, load_config, read_properties
from diskless.log.config import ConfigError


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "server.properties"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load_config(environ={})
    assert config == BrokerConfig()
    assert config.topic_defaults == {}
    assert config.listener == Endpoint("127.0.0.1", 9092)


def test_precedence_file_env_overrides(tmp_path: Path) -> None:
    path = _file(tmp_path, "log.retention.ms=1000\nnum.partitions=2\nlog.dirs=/file\n")
    assert load_config(path, environ={}).topic_defaults["log.retention.ms"] == "1000"

    env = {"DISKLESS_LOG_RETENTION_MS": "2000", "DISKLESS_NUM_PARTITIONS": "3"}
    config = load_config(path, environ=env)
    assert config.topic_defaults["log.retention.ms"] == "2000"
    assert config.num_partitions == 3
    assert config.log_dirs == "/file"

    config = load_config(path, environ=env, overrides={"log.retention.ms": "3000", "log.dirs": "/flag"})
    assert config.topic_defaults["log.retention.ms"] == "3000"
    assert config.broker_value("log.retention.ms") == "3000"
    assert config.num_partitions == 3
    assert config.log_dirs == "/flag"


def test_precedence_holds_across_aliases(tmp_path: Path) -> None:
    path = _file(tmp_path, "node.id=1\n")
    assert load_config(path, environ={"DISKLESS_BROKER_ID": "2"}).node_id == 2
    assert load_config(path, environ={"DISKLESS_BROKER_ID": "2"}, overrides={"node.id": "3"}).node_id == 3
    assert load_config(path, environ={"DISKLESS_NODE_ID": "2"}, overrides={"broker.id": "4"}).node_id == 4


def test_environment_uses_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISKLESS_LOG_RETENTION_MS", "42")
    monkeypatch.setenv("DISKLESS_AUTO_CREATE_TOPICS_ENABLE", "false")
    config = load_config()
    assert config.topic_defaults["log.retention.ms"] == "42"
    assert config.auto_create_topics_enable is False


def test_env_properties_ignores_unrelated_variables() -> None:
    assert env_properties({"DISKLESS_NOT_A_SETTING": "1", "LOG_RETENTION_MS": "5", "PATH": "/bin"}) == {}
    assert env_properties({"DISKLESS_LOG_SEGMENT_BYTES": "100"}) == {"log.segment.bytes": "100"}


@pytest.mark.parametrize("source", ["file", "overrides"])
def test_unknown_key_raises(tmp_path: Path, source: str) -> None:
    if source == "file":
        kwargs = {"path": _file(tmp_path, "log.retention.msec=5\n")}
    else:
        kwargs = {"overrides": {"no.such.setting": "1"}}
    with pytest.raises(ConfigError, match="unknown broker config"):
        load_config(environ={}, **kwargs)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("num.partitions", "many"),
        ("node.id", "1.5"),
        ("auto.create.topics.enable", "maybe"),
        ("log.retention.ms", "-5"),
        ("log.retention.ms", "forever"),
        ("log.segment.bytes", "1"),
        ("log.message.timestamp.type", "Now"),
        ("log.cleanup.policy", "compacted"),
        ("diskless.s3.hedge.quantile", "often"),
        ("diskless.s3.hedge.quantile", "nan"),
    ],
)
def test_bad_values_raise(name: str, value: str) -> None:
    with pytest.raises(ConfigError):
        load_config(environ={}, overrides={name: value})


def test_topic_defaults_are_normalised() -> None:
    config = load_config(environ={}, overrides={"log.retention.ms": " 77 ", "unclean.leader.election.enable": "TRUE"})
    assert config.topic_defaults == {"log.retention.ms": "77", "unclean.leader.election.enable": "true"}


def test_read_properties(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "# comment\n! also a comment\n\n  listeners = PLAINTEXT://0.0.0.0:9999 \nbroker.rack:az-1\nlog.dirs=/a=b\n",
    )
    assert read_properties(path) == {
        "listeners": "PLAINTEXT://0.0.0.0:9999",
        "broker.rack": "az-1",
        "log.dirs": "/a=b",
    }
    config = load_config(path, environ={})
    assert config.listener == Endpoint("0.0.0.0", 9999)
    assert config.advertised(9999) == Endpoint("127.0.0.1", 9999)
    assert config.broker_rack == "az-1"
    # "just words" is the key "just" with the value "words" (java.util.Properties), unknown here.
    with pytest.raises(ConfigError, match="unknown broker config 'just'"):
        load_config(_file(tmp_path, "just words\n"), environ={})
    with pytest.raises(ConfigError, match="malformed"):
        read_properties(_file(tmp_path, "broker.rack=\\u12\n"))


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("PLAINTEXT://host:1", Endpoint("host", 1)),
        ("host:2", Endpoint("host", 2)),
        (":3", Endpoint("0.0.0.0", 3)),
        ("PLAINTEXT://a:4,SSL://b:5", Endpoint("a", 4)),
    ],
)
def test_endpoint_parse(text: str, endpoint: Endpoint) -> None:
    assert Endpoint.parse(text) == endpoint


def test_advertised_listener_wins() -> None:
    config = load_config(environ={}, overrides={"advertised.listeners": "PLAINTEXT://public:19092"})
    assert config.advertised(1234) == Endpoint("public", 19092)


def test_ratios_are_floats() -> None:
    config = load_config(
        environ={"DISKLESS_DISKLESS_S3_HEDGE_MAX_RATIO": "0.1"}, overrides={"diskless.s3.hedge.quantile": "0"}
    )
    assert (config.diskless_s3_hedge_quantile, config.diskless_s3_hedge_max_ratio) == (0.0, 0.1)
    assert BrokerConfig().diskless_s3_hedge_quantile == 0.95


def test_advertised_listeners_are_checked_at_load() -> None:
    """Kafka checks advertised.listeners at startup: unparseable, or naming a listener that is not
    in listeners ("advertised.listeners listener names must be equal to or a subset of the ones
    defined in listeners"), stops the broker. Diskless loaded both: the first failed only in
    Broker.start after the listeners were bound, the second advertised the bind address instead."""
    with pytest.raises(ConfigError):
        load_config(environ={}, overrides={"advertised.listeners": "garbage"})
    two = {"listeners": "A://:9092,B://:9093", "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT"}
    with pytest.raises(ConfigError, match=r"advertised\.listeners names \[.C.\]"):
        load_config(environ={}, overrides={**two, "advertised.listeners": "A://a:1,C://c:3"})
    config = load_config(environ={}, overrides={**two, "advertised.listeners": "B://b:2"})
    assert config.advertised_endpoints({"A": 9092})["B"] == Endpoint("b", 2)
    # One listener: an advertised address under another name (PLAINTEXT when bare) is its own.
    config = load_config(environ={}, overrides={"listeners": "INTERNAL://:9092", "advertised.listeners": "h:19092"})
    assert config.advertised(9092) == Endpoint("h", 19092)


def test_values_are_trimmed_and_parsed_as_kafka_does() -> None:
    """Kafka's ConfigDef.parseType trims every value before parsing it (BOOLEAN, INT, STRING...)
    and parses numbers with Integer.parseInt. Diskless trimmed properties-file values and numbers
    only: " false" from the environment stopped the broker, a rack "az-a " kept its space (so
    matched no client's AZ), and int() took "1_0" as 10."""
    env = {"DISKLESS_AUTO_CREATE_TOPICS_ENABLE": " false ", "DISKLESS_BROKER_RACK": " az-a "}
    config = load_config(environ=env)
    assert config.auto_create_topics_enable is False
    assert config.broker_rack == "az-a"
    with pytest.raises(ConfigError):
        load_config(environ={}, overrides={"node.id": "1_0"})


def test_read_properties_as_java_does(tmp_path: Path) -> None:
    """java.util.Properties (what Kafka reads server.properties with): a line ending in a backslash
    goes on on the next line (its leading blanks dropped), a key may end at a blank instead of '='
    or ':', and backslash escapes a separator or a backslash. Diskless read each physical line on
    its own, so a listeners list split over lines stopped the broker ("unknown broker config
    'SSL'") and "num.partitions 3" was refused."""
    text = (
        "listeners=A://:9092,\\\n"
        "    B://:9093\n"
        "num.partitions 3\n"
        "broker.rack = az\\:1\n"
        "log.dirs=C:\\\\data\n"
        "super.users=User:a;\\\n"
        "  User:b\n"
    )
    assert read_properties(_file(tmp_path, text)) == {
        "listeners": "A://:9092,B://:9093",
        "num.partitions": "3",
        "broker.rack": "az:1",
        "log.dirs": "C:\\data",
        "super.users": "User:a;User:b",
    }
