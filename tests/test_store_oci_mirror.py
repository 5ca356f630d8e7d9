"""Reads through a pull-through mirror: a second docker-registry in proxy mode before the first.

Counts what reaches the origin: blobs and manifests by digest once per object whatever the
number of nodes; distribution 2.8's proxy still asks the origin for a tag's digest (a HEAD) on
every tag read, so that is counted and bounded separately.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conftest import FP, plan_bytes
from plancache.storage.store import open_store
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry, registry_binary
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)

NODES = 8


@pytest.fixture
def mirror(registry: DockerRegistry) -> Iterator[DockerRegistry]:
    binary = registry_binary()
    assert binary is not None
    server = DockerRegistry(binary, remote=registry.endpoint)
    yield server
    server.stop()


def test_a_storm_through_one_mirror_reaches_the_origin_once_per_blob_not_per_node(
    registry: DockerRegistry, mirror: DockerRegistry
) -> None:
    repo = registry.new_repository("mirrored")
    origin = open_store(registry.url(repo), timeout=30)
    origin.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b"sig"})
    before = len(registry.requests(repo))
    for _ in range(NODES):
        node = open_store(registry.url(repo), {"mirror": mirror.host}, timeout=30)
        got = node.fetch(FP)
        assert (got.plan_bytes, got.sig_bytes) == (plan_bytes(), b"sig")
    registry.wait_logged(before + 1, repo)
    seen = registry.requests(repo)[before:]
    blob_gets = [u for m, u in seen if m == "GET" and "/blobs/" in u]
    manifest_gets = [u for m, u in seen if m == "GET" and "/manifests/" in u]
    # the plan's blob: once, or twice while the mirror's first copy is still being stored
    # (distribution 2.8 streams the first fetch to the client and the cache at once)
    assert 1 <= len(blob_gets) <= 2, seen
    assert len(manifest_gets) <= 1, seen
    heads = [u for m, u in seen if m == "HEAD"]
    assert len(heads) <= NODES + 2 and len(seen) - len(heads) <= 4, seen  # content: once or twice
