"""Every test server the suite starts in a process of its own listens below the kernel's
ephemeral range (tests/late_ports.py): it binds seconds after its port was picked, and a port
from the ephemeral range could be taken meanwhile by any client or ``bind(("", 0))`` on the
machine (Azurite lost that race once, 2026-12-06)."""

from __future__ import annotations

from azurite_server import Azurite
from late_ports import ephemeral_low
from registry_server import DockerRegistry
from store_servers import (
    GcsEmulator,
    MotoServer,
    azurite,  # noqa: F401 - a fixture, named as a parameter
    gcs_emulator,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
    registry,  # noqa: F401 - a fixture, named as a parameter
)


def _listens_below_the_ephemeral_range(port: int) -> None:
    assert port < ephemeral_low(), (port, ephemeral_low())


def test_moto_listens_below_the_ephemeral_range(moto_server: MotoServer) -> None:
    _listens_below_the_ephemeral_range(moto_server.port)
    assert moto_server.client().list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_the_gcs_emulator_listens_below_the_ephemeral_range(gcs_emulator: GcsEmulator) -> None:
    _listens_below_the_ephemeral_range(gcs_emulator.port)
    assert gcs_emulator.new_bucket()


def test_the_registry_listens_below_the_ephemeral_range(registry: DockerRegistry) -> None:
    _listens_below_the_ephemeral_range(registry.port)
    assert registry.get("/v2/")[0] == 200


def test_azurite_listens_below_the_ephemeral_range(azurite: Azurite) -> None:
    _listens_below_the_ephemeral_range(azurite.port)
    assert azurite.new_container()
