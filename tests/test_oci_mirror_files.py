"""A registry's mirror from the node's own configuration (storage/oci/mirrors/): containerd's
``hosts.toml`` and containers' ``registries.conf`` as their runtimes resolve them, hostile files
refused in one line, and the registry's storage options checked like every store's.

No server: opening a registry store reads files only; which client reads what is looked at on
the store's filesystem object (tests/test_store_oci_mirror.py reads through a real mirror).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plancache.storage.oci.access.credential_files import find_credentials
from plancache.storage.oci.mirrors import mirror_choice, mirror_hosts
from plancache.storage.oci.registry_urls import write_options
from plancache.storage.store import open_store
from plancache.trust.errors import ConfigError

REGISTRY = "registry.example:5000"
URL = f"oci://{REGISTRY}/team/app"


@pytest.fixture(autouse=True)
def no_node_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The node's places moved under tmp_path: containerd's roots, containers' files, HOME."""
    etc = tmp_path / "etc"
    monkeypatch.setattr(mirror_choice, "CONTAINERD_ROOTS", (etc / "containerd" / "certs.d",))
    monkeypatch.setattr(mirror_choice, "REGISTRIES_CONF", etc / "containers" / "registries.conf")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CONTAINERS_REGISTRIES_CONF", raising=False)
    return etc


def readers(options: dict[str, Any] | None = None, url: str = URL) -> tuple[str, str, str]:
    """(where tags are read, where content is read, the content reader's repository)."""
    fs = open_store(url, options or {}, timeout=5).backend
    return fs.tag_reader.base, fs.reader.base, fs.reader.repository


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_containerd_hosts_toml_in_its_directory_order(no_node_configuration: Path) -> None:
    root = no_node_configuration / "containerd" / "certs.d"
    write(root / "_default" / "hosts.toml", '[host."https://everything.mirror"]\n')
    assert readers() == ("https://everything.mirror",) * 2 + ("team/app",)
    write(root / REGISTRY / "hosts.toml", '[host."https://colon.mirror"]\n')
    assert readers()[1] == "https://colon.mirror"
    write(
        root / "registry.example_5000_" / "hosts.toml",
        'server = "https://registry.example:5000"\n'
        '[host."https://registry.example:5000"]\n'  # the registry itself: not a mirror
        '[host."https://first.mirror:8443/v2"]\n  capabilities = ["pull"]\n'
        '[host."https://second.mirror"]\n',
    )
    assert readers() == (f"https://{REGISTRY}", "https://first.mirror:8443", "team/app")
    (root / "registry.example_5000_" / "hosts.toml").unlink()  # certificates only: no mirror
    assert readers() == (f"https://{REGISTRY}",) * 2 + ("team/app",)


def test_a_containerd_mirror_with_its_own_ca_and_a_server_only_file(tmp_path: Path) -> None:
    ca = write(tmp_path / "hosts" / "mirror-ca.pem", "not a certificate\n")
    hosts = write(
        tmp_path / "hosts" / "hosts.toml", '[host."https://m.example"]\n  ca = "mirror-ca.pem"\n'
    )
    with pytest.raises(ConfigError, match=str(ca)):  # relative to the file, read as PEM
        readers({"mirror_config": str(hosts)})
    write(hosts, 'server = "https://only.mirror"\ncapabilities = ["resolve"]\n')
    assert readers({"mirror_config": str(hosts)})[:2] == (
        "https://only.mirror",
        f"https://{REGISTRY}",
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("this is [not toml", "is not TOML"),
        ('[host."https://m.example"]\n  skip_verify = true\n', "skip TLS verification"),
        ('[host."https://m.example"]\n  client = "c.pem"\n', "client certificate"),
        ('[host."https://m.example"]\n  capabilities = ["fly"]\n', "unknown capability"),
        ('[host."https://m.example/prefix"]\n', "API path of its own"),
        ('[host."https://user:pw@m.example"]\n', "carries credentials"),
        ('[host."https://m.example"]\n  capabilities = "pull"\n', "not a list"),
    ],
)
def test_hostile_or_unsupported_hosts_toml_is_one_config_error(
    tmp_path: Path, text: str, says: str
) -> None:
    hosts = write(tmp_path / "hosts.toml", text)
    with pytest.raises(ConfigError, match=says) as err:
        readers({"mirror_config": str(hosts)})
    assert "pw" not in err.value.detail


def test_a_fifo_or_a_huge_file_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "certs.d" / REGISTRY / "hosts.toml"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        readers({"mirror_config": str(tmp_path / "certs.d")})
    huge = write(tmp_path / "hosts.toml", "# " + "x" * mirror_hosts.MAX_CONFIG + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        readers({"mirror_config": str(huge)})


def test_every_configuration_file_is_refused_in_the_same_words(tmp_path: Path) -> None:
    """A registry store reads three of the node's files (the auth file, the mirror
    configuration, a CA bundle) through one reader: each refuses a FIFO, and an absent file it
    was told of, with its own name first and the same words after it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    absent = tmp_path / "absent"

    def opened(option: str) -> Callable[[Path], object]:
        return lambda path: open_store(URL, {option: str(path)}, timeout=5)

    def auth_file(path: Path) -> object:  # read at the first 401, off the loop: asked here
        return asyncio.run(find_credentials(REGISTRY, str(path)))

    for read, what in (
        (auth_file, "registry auth file"),
        (opened("mirror_config"), "mirror configuration"),
        (opened("ca_file"), "ca_file"),
    ):
        said = []
        for path in (fifo, absent):
            with pytest.raises(ConfigError) as err:
                read(path)
            said.append(err.value.detail)
        assert said == [f"{what}: {fifo} is not a regular file", f"{what} {absent} does not exist"]


def test_registries_conf_prefixes_drop_ins_and_pull_from_mirror(
    no_node_configuration: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = no_node_configuration / "containers" / "registries.conf"
    write(
        conf,
        'unqualified-search-registries = ["docker.io"]\n'
        '[[registry]]\nlocation = "registry.example:5000"\n'
        '[[registry.mirror]]\nlocation = "mirror.internal/cache"\n'
        '[[registry]]\nprefix = "registry.example:5000/team/app"\nlocation = "elsewhere.example"\n'
        'mirror-by-digest-only = true\n[[registry.mirror]]\nlocation = "digests.internal/app"\n',
    )
    assert readers() == (f"https://{REGISTRY}", "https://digests.internal", "app")
    other = f"oci://{REGISTRY}/team/other"  # the shorter prefix; the repository mapped under it
    assert readers(url=other) == ("https://mirror.internal",) * 2 + ("cache/team/other",)
    write(
        conf.with_suffix(".conf.d") / "50-tags.conf",
        '[[registry]]\nprefix = "registry.example:5000/team/app"\nlocation = "x.example"\n'
        '[[registry.mirror]]\nlocation = "tags.internal/team/app"\npull-from-mirror = "tag-only"\n',
    )
    assert readers() == ("https://tags.internal", f"https://{REGISTRY}", "team/app")
    user = write(
        no_node_configuration.parent / "elsewhere.conf",
        '[[registry]]\nprefix = "*.example:5000"\nlocation = "x.example"\n'
        '[[registry.mirror]]\nlocation = "127.0.0.1:5001"\ninsecure = true\n',
    )
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(user))
    assert readers()[0] == "https://tags.internal"  # a drop-in still wins for its prefix
    assert readers(url=other) == ("http://127.0.0.1:5001",) * 2 + ("team/other",)
    assert readers({"mirror_config": "none"}) == (f"https://{REGISTRY}",) * 2 + ("team/app",)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[registry]]\nlocation = "registry.example:5000"\nblocked = true\n', "is blocked"),
        (
            '[[registry]]\nlocation = "registry.example:5000"\n'
            '[[registry.mirror]]\nlocation = "https://m.example"\n',
            "takes no scheme",
        ),
        (
            '[[registry]]\nlocation = "registry.example:5000"\n'
            '[[registry.mirror]]\nlocation = "m.example"\npull-from-mirror = "sometimes"\n',
            "pull-from-mirror",
        ),
        ("[[registry]]\nlocation = 5\n", "not a string"),
        ('registry = "x"\n', "not a list"),
    ],
)
def test_hostile_or_refusing_registries_conf_is_one_config_error(
    tmp_path: Path, text: str, says: str
) -> None:
    conf = write(tmp_path / "registries.conf", text)
    with pytest.raises(ConfigError, match=says):
        readers({"mirror_config": str(conf)})


def test_an_explicit_file_must_exist_and_a_plain_http_mirror_keeps_the_origin_on_tls(
    tmp_path: Path,
) -> None:
    """registries.conf's ``insecure = true`` makes the mirror plain HTTP by itself (issue 47:
    it once needed ``plain_http=true``, which put the registry itself on HTTP too)."""
    with pytest.raises(ConfigError, match="does not exist"):
        readers({"mirror_config": str(tmp_path / "absent.conf")})
    conf = write(
        tmp_path / "registries.conf",
        '[[registry]]\nlocation = "registry.example:5000"\n'
        '[[registry.mirror]]\nlocation = "m.example"\ninsecure = true\n',
    )
    fs = open_store(URL, {"mirror_config": str(conf)}, timeout=5).backend
    assert (fs.reader.base, fs.origin.base) == ("http://m.example", "https://registry.example:5000")
    hosts = write(
        tmp_path / "certs.d" / "registry.example_5000_" / "hosts.toml",
        'server = "https://registry.example:5000"\n[host."http://m.example:5000"]\n',
    )
    fs = open_store(URL, {"mirror_config": str(hosts.parent.parent)}, timeout=5).backend
    assert fs.reader.base == "http://m.example:5000"
    assert fs.origin.base == "https://registry.example:5000"
    fs = open_store(URL, {"mirror_config": str(conf), "mirror_reads": "false"}, timeout=5).backend
    assert fs.reader is fs.origin and fs.tag_reader is fs.origin
    writing = write_options(URL, {"mirror_config": str(conf), "mirror_reads": True})
    fs = open_store(URL, writing, timeout=5).backend  # a push reads nothing through a mirror
    assert fs.reader is fs.origin and fs.tag_reader is fs.origin
    assert write_options("s3://bucket/plans", {"a": 1}) == {"a": 1}  # only a registry takes it


@pytest.mark.parametrize(
    ("key", "guess"),
    [("mirorr", "mirror"), ("plain-http", "plain_http"), ("mirror-config", "mirror_config")],
)
def test_a_misspelt_registry_option_gets_the_stores_did_you_mean(key: str, guess: str) -> None:
    with pytest.raises(ConfigError) as err:
        open_store(URL, {key: "x"}, timeout=5)
    assert err.value.detail == (
        f"unknown storage option {key!r} for oci:// "
        f"(plancache.storage.oci.registry.RegistryBackend); did you mean {guess!r}?"
    )
