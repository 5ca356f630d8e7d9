"""A storm of nodes through one pull-through mirror: docker-registry 2.8 in proxy mode before
another, every request that reaches the origin counted from its log.

Each node is a thread with its own store (its own HTTP session), all released at once. What
2.8's proxy does, read from its source and measured here (docs/stores.md, Mirrors):

* a tag read asks the origin what the tag names (one ``HEAD``) every time: inherent to the
  proxy, one per node, bodiless;
* a manifest is fetched from the origin once and stored *before* the proxy answers, so every
  later read is served from the mirror; a plan and its signature ride inside their manifest
  (``data``), so a node's whole read is that one manifest;
* concurrent misses are not merged: on a cold mirror every node that asks before the first
  answer is stored reaches the origin (at most one content read per node). A fleet's mirror is
  warm when its nodes boot because the first node of a rollout (or the CI bake reading its
  push back through the mirror) read it first: the warm storm is the fleet's case.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from conftest import FP, plan_bytes
from plancache.storage.store import Store, open_store
from plancache.trust.errors import ConfigError
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry, registry_binary
from registry_stub import RegistryStub
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)
from test_store_oci_referrers import push_image

NODES = 8


@pytest.fixture
def mirror(registry: DockerRegistry) -> Iterator[DockerRegistry]:
    binary = registry_binary()
    assert binary is not None
    server = DockerRegistry(binary, remote=registry.endpoint)
    yield server
    server.stop()


def pushed(registry: DockerRegistry) -> str:
    repo = registry.new_repository("mirrored")
    origin = open_store(registry.url(repo), timeout=30)
    origin.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b"sig"})
    return repo


def node_store(registry: DockerRegistry, repo: str, mirror: DockerRegistry) -> Store:
    return open_store(
        registry.url(repo), {"mirror": mirror.host, "mirror_config": "none"}, timeout=30
    )


def storm(stores: list[Store]) -> None:
    """Every store reads the plan and its signature, all released at once; each must get them."""
    start = threading.Barrier(len(stores))
    got: list[object] = []

    def node(store: Store) -> None:
        start.wait(60)
        result = store.fetch(FP)
        got.append((result.plan_bytes, result.sig_bytes))

    threads = [threading.Thread(target=node, args=(s,), daemon=True) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert got == [(plan_bytes(), b"sig")] * len(stores)


def origin_reads(registry: DockerRegistry, repo: str, before: int) -> list[tuple[str, str]]:
    return [(m, u.rsplit("/", 1)[-1]) for m, u in registry.settled_requests(repo)[before:]]


def test_a_storm_through_a_warm_mirror_reaches_the_origin_once_per_object(
    registry: DockerRegistry, mirror: DockerRegistry
) -> None:
    repo = pushed(registry)
    tag = plan_name(FP)
    before = len(registry.settled_requests(repo))
    storm([node_store(registry, repo, mirror)])  # the first node: the mirror fetches the object
    assert origin_reads(registry, repo, before) == [("HEAD", tag), ("GET", tag)]
    before = len(registry.settled_requests(repo))
    storm([node_store(registry, repo, mirror) for _ in range(NODES)])
    assert origin_reads(registry, repo, before) == [("HEAD", tag)] * NODES  # no content at all


def test_a_cold_storm_reaches_the_origin_at_most_once_per_node_and_never_again(
    registry: DockerRegistry, mirror: DockerRegistry
) -> None:
    repo = pushed(registry)
    before = len(registry.settled_requests(repo))
    storm([node_store(registry, repo, mirror) for _ in range(NODES)])
    seen = origin_reads(registry, repo, before)
    heads = [r for r in seen if r[0] == "HEAD"]
    content = [r for r in seen if r[0] != "HEAD"]
    assert len(heads) == NODES and 1 <= len(content) <= NODES, seen
    assert all(r == ("GET", plan_name(FP)) for r in content), seen  # the manifest, no blob
    before = len(registry.settled_requests(repo))
    storm([node_store(registry, repo, mirror) for _ in range(NODES)])
    assert origin_reads(registry, repo, before) == [("HEAD", plan_name(FP))] * NODES


def test_a_mirror_trusted_with_content_only_gets_no_tag_read(
    registry: DockerRegistry, mirror: DockerRegistry, tmp_path: Path
) -> None:
    """containerd's ``capabilities = ["pull"]``: each node asks the registry what the tag names
    (the same one HEAD per node the proxy would send), the mirror serves the manifest by digest."""
    repo = pushed(registry)
    hosts = tmp_path / "certs.d" / (registry.host.replace(":", "_") + "_")
    hosts.mkdir(parents=True)
    (hosts / "hosts.toml").write_text(
        f'server = "http://{registry.host}"\n'
        f'[host."http://{mirror.host}"]\n  capabilities = ["pull"]\n'
    )
    options = {"mirror_config": str(tmp_path / "certs.d")}
    stores = [open_store(registry.url(repo), options, timeout=30) for _ in range(NODES + 1)]
    storm(stores[:1])
    before = len(registry.settled_requests(repo))
    storm(stores[1:])
    assert origin_reads(registry, repo, before) == [("HEAD", plan_name(FP))] * NODES
    by_mirror = [u for _, u in mirror.settled_requests(repo)]
    assert len(by_mirror) == NODES + 1 and all("/manifests/sha256:" in u for u in by_mirror)
    asked_for = [parse_qs(urlsplit(u).query).get("ns") for u in by_mirror]
    assert asked_for == [[registry.host]] * len(by_mirror)  # containerd's query


def test_registries_conf_from_CONTAINERS_REGISTRIES_CONF(
    registry: DockerRegistry,
    mirror: DockerRegistry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = pushed(registry)
    conf = tmp_path / "registries.conf"
    conf.write_text(
        f'[[registry]]\nlocation = "{registry.host}"\n'
        f'[[registry.mirror]]\nlocation = "{mirror.host}"\n'
    )
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    storm([open_store(registry.url(repo), timeout=30)])
    assert [m for m, _ in mirror.settled_requests(repo)] == ["GET"]  # the tag, at the mirror
    conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\nblocked = true\n')
    with pytest.raises(ConfigError, match="blocked"):
        open_store(registry.url(repo), timeout=30)


def test_attached_plans_through_a_mirror_of_a_registry_with_the_referrers_api(
    tmp_path: Path,
) -> None:
    """The proxy has no referrers route (a 404 of its own: the origin is never asked), so a node
    reading what is attached to an image falls back to the tag schema, which plancache keeps on
    a registry with the API too."""
    binary = registry_binary()
    assert binary is not None
    stub = RegistryStub()
    proxy = DockerRegistry(binary, remote=f"http://{stub.host}")
    try:
        image = push_image(f"http://{stub.host}", "team/app", "v1")
        store = open_store(stub.url("team/app"), {"subject": "v1"}, timeout=30)
        store.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b"sig"})
        stub.state.requests.clear()
        node = open_store(
            stub.url("team/app"),
            {"mirror": proxy.host, "mirror_config": "none", "subject": f"@{image}"},
            timeout=30,
        )
        got = node.fetch(FP)
        assert (got.plan_bytes, got.sig_bytes) == (plan_bytes(), b"sig")
        assert not any("/referrers/" in p for _, p, _ in stub.state.requests)
        index_tag = "/manifests/sha256-" + image.split(":")[1]
        assert any(index_tag in u for _, u in proxy.settled_requests("team/app"))
    finally:
        proxy.stop()
        stub.stop()
