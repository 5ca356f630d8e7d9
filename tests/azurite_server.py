"""Azurite, Microsoft's Azure Storage emulator, for the store tests (blob service only).

Installed with npm into ``.test-tools/`` by scripts/bootstrap-test-env.sh; started on a free
loopback port with its data in memory and its telemetry off (nothing leaves loopback).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from late_ports import late_port
from store_servers import LOOPBACK, _stop, wait_for_port

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's well-known development account (public, documented by Microsoft)."""


def azure_connection_string(endpoint: str) -> str:
    """A connection string for the development account with its blob endpoint at ``endpoint``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def azurite_binary() -> str | None:
    """``$AZURITE_BLOB``, else the bootstrap's ``.test-tools`` install, else PATH."""
    local = Path(__file__).resolve().parents[1] / ".test-tools" / "node_modules" / ".bin"
    return (
        os.environ.get("AZURITE_BLOB")
        or shutil.which("azurite-blob", path=str(local))
        or shutil.which("azurite-blob")
    )


class Azurite:
    """Azurite's blob service on a free loopback port, data in memory, telemetry off."""

    def __init__(self, binary: str) -> None:
        # below the ephemeral range (tests/late_ports.py): Node takes a second or more to bind,
        # and a port from free_port() was once taken meanwhile by another worker's server, which
        # answered Azurite's requests (create_container: "invalid status 'OK'")
        self.port = late_port(LOOPBACK)
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.proc = subprocess.Popen(
            [
                binary,
                "--blobHost",
                LOOPBACK,
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--extentMemoryLimit",
                "256",
                "--skipApiVersionCheck",
                "--loose",
                "--silent",
                "--disableTelemetry",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.proc)
        self.connection_string = azure_connection_string(self.endpoint)
        self._containers = 0

    def new_container(self) -> str:
        from azure.storage.blob import BlobServiceClient

        self._containers += 1
        name = f"plancache-test-{self._containers}"
        BlobServiceClient.from_connection_string(self.connection_string).create_container(name)
        return name

    @property
    def options(self) -> dict[str, object]:
        return {"connection_string": self.connection_string}

    def stop(self) -> None:
        _stop(self.proc)
