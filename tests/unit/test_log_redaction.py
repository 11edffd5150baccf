"""S3 and etcd credentials, the cluster secret and key passwords never reach the logs, however
they are logged: as a field, inside a message, in an exception, through stdlib logging."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
import structlog

from diskless.config import load_config
from diskless.logs import configure_logging

S3_SECRET = "s3-Sup3rSecretKey-value"
S3_ACCESS = "AKIAEXAMPLEACCESS01"
CLUSTER_SECRET = "cluster-secret-xyz-123"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


def test_credentials_from_config_and_env_are_redacted(monkeypatch, restored_logging) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("DEBUG")
    config = load_config(
        environ={"DISKLESS_DISKLESS_S3_SECRET_KEY": S3_SECRET},
        overrides={"diskless.s3.access.key": S3_ACCESS, "diskless.cluster.secret": CLUSTER_SECRET},
    )
    assert config.diskless_s3_secret_key == S3_SECRET  # the value itself is intact for use
    log = structlog.get_logger("test")
    log.info("connecting to s3", secret_key=S3_SECRET, endpoint="http://s3:8333")
    log.warning(f"request signed with {S3_ACCESS}:{S3_SECRET} failed")
    log.info("config", config=repr(config), password="hunter2", etcd="http://user:pw@etcd:2379")
    try:
        raise RuntimeError(f"auth failed for secret {CLUSTER_SECRET}")
    except RuntimeError:
        log.exception("boom")
    logging.getLogger("botocore.auth").warning("StringToSign with key %s", S3_SECRET)
    for handler in logging.getLogger().handlers:
        handler.flush()
    text = stream.getvalue()
    for secret in (S3_SECRET, S3_ACCESS, CLUSTER_SECRET, "hunter2", "user:pw@"):
        assert secret not in text, f"{secret} leaked:\n{text}"
    assert text.count("[redacted]") >= 6
    assert "http://s3:8333" in text  # what is not a credential stays readable
