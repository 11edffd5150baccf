"""deploy/: the docker-compose file refers only to files that exist, and every broker config loads.

Docker is not needed: the compose file is parsed with PyYAML, paths are resolved the way compose
resolves them (relative to the compose file's directory), and each broker's properties file is
loaded with the broker's own ``load_config``, which rejects unknown property names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from diskless.config import BrokerConfig, load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict)
    return document


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of each bind mount (short syntax, or long syntax with type bind)."""
    mounts: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, _, rest = volume.partition(":")
            target = rest.split(":")[0]
            if source.startswith((".", "/")):
                mounts[target] = (COMPOSE.parent / source).resolve()
        elif volume.get("type") == "bind":
            mounts[volume["target"]] = (COMPOSE.parent / volume["source"]).resolve()
    return mounts


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def broker_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if command_of(s)[:2] == ["diskless", "broker"]}


def broker_config(service: dict[str, Any]) -> tuple[Path, BrokerConfig]:
    command = command_of(service)
    target = command[command.index("--config") + 1]
    mounts = bind_mounts(service)
    assert target in mounts, f"{target} is not bind-mounted into the container"
    return mounts[target], load_config(str(mounts[target]), environ={})


def test_services_are_the_expected_ones(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["minio"]["image"].startswith("minio/minio")
    assert command_of(services["minio"])[:2] == ["server", "/data"]
    assert re.match(r"(quay\.io/coreos/etcd|bitnami/etcd)(:|$)", services["etcd"]["image"])
    assert sorted(broker_services(compose)) == ["broker-1", "broker-2", "broker-3"]
    managers = sorted(name for name in services if name.startswith("wal-manager"))
    assert managers == ["wal-manager-a", "wal-manager-b"], "an active WAL manager and a standby"
    for name in managers:
        command = command_of(services[name])
        assert command[:2] == ["diskless", "wal-manager"]
        advertised = services[name]["environment"]["DISKLESS_ADVERTISED_LISTENERS"]
        assert advertised == f"PLAINTEXT://{name}:9500"


def test_referenced_files_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is not None:
            context = (COMPOSE.parent / (build if isinstance(build, str) else build.get("context", "."))).resolve()
            assert context.is_dir(), f"{name}: build context {context} missing"
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            assert (context / dockerfile).is_file(), f"{name}: {context / dockerfile} missing"
            for line in (context / dockerfile).read_text().splitlines():
                if line.startswith("COPY "):
                    for source in line.split()[1:-1]:
                        assert (context / source).exists(), f"{name}: Dockerfile copies missing {source}"
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: bind mount {source} -> {target} missing"
        for volume in service.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/")):
                assert volume.split(":")[0] in (compose.get("volumes") or {}), f"{name}: undeclared {volume}"
        for dependency in service.get("depends_on", {}):
            assert dependency in compose["services"], f"{name} depends on unknown {dependency}"


def test_each_broker_config_loads_with_distinct_id_and_rack(compose: dict[str, Any]) -> None:
    services = broker_services(compose)
    configs = {name: broker_config(service)[1] for name, service in services.items()}
    assert len({c.node_id for c in configs.values()}) == 3
    assert sorted(c.broker_rack or "" for c in configs.values()) == ["az-1", "az-2", "az-3"]
    for name, config in configs.items():
        assert config.metadata_etcd_endpoints == "etcd:2379"
        assert config.diskless_s3_endpoint == "http://minio:9000"
        advertised = config.advertised(config.listener.port)
        # Advertised under the compose service name, on the port the broker listens on and publishes.
        assert advertised.host == name
        assert advertised.port == config.listener.port
        published = [str(p).rsplit(":", 2)[-2:] for p in services[name].get("ports", [])]
        assert [str(config.listener.port)] * 2 in published, f"{name}: listener port not published as-is"
    assert len({c.cluster_id for c in configs.values()}) == 1


def test_every_properties_file_in_deploy_loads() -> None:
    files = sorted(DEPLOY.glob("*.properties"))
    assert files
    for path in files:
        load_config(str(path), environ={})


def test_the_wal_manager_config_passes_its_startup_safety_check() -> None:
    from wal_manager.service import check_config

    check_config(load_config(str(DEPLOY / "wal-manager.properties"), environ={}))
