"""Where the bytes came from, when the node's configuration names a mirror (issue 47, item 6).

The origin is Debian's docker-registry on 127.0.0.1, the mirror another in proxy mode in front
of it (tests/registry_server.py), named the way a node names it: a containerd ``hosts.toml``
under a ``certs.d`` directory. Every request each of them answered is in its log, which is how
these tests see which one was read:

* ``verify``, ``ls`` (audits) and ``push`` (what is already stored) read the registry itself;
  ``mirror_reads=true`` is the operator's explicit way to audit through the mirror;
* a read through a mirror (``pull``, the plugin's boot) is named in the human output
  (``read via mirror HOST (configured in FILE)``) and the JSON report (``via_mirror``);
* a mirror that fails is named with the file that configured it;
* a prune that deletes judges from the registry even when told ``mirror_reads=true`` (a
  mirror's tag list that leaves out a plan, a stub here, would cost the registry its set).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.clock import Stopwatch
from plancache.keys.keyfile import generate_keypair
from plancache.keys.schemes import load_signer
from plancache.pipeline.resolver import utcnow
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.oci.artifacts import slot_of
from plancache.storage.store import open_store
from plancache.trust.plans.gate import Decision, Verdict
from plancache.trust.plans.plan import plan_name, sig_name
from plancache.trust.plans.plan_set import build_set
from plancache.trust.policy import TrustPolicy
from plancache.trust.signing import sign_plan
from plancache.vllm_plugin.boot import log_decision
from plancache.vllm_plugin.config import PluginConfig
from plancache.vllm_plugin.worker_boot import Boot
from registry_server import DockerRegistry, registry_binary
from registry_stub import RegistryStub
from store_servers import (
    closed_port,
    registry,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"
PLANCACHE_PATHS = r"^/v2/.+/"
"""Requests for a repository (the tests' own ``/v2/?settled=N`` markers are not)."""


@pytest.fixture
def mirror(registry: DockerRegistry) -> Iterator[DockerRegistry]:
    binary = registry_binary()
    assert binary is not None
    server = DockerRegistry(binary, remote=registry.endpoint)
    yield server
    server.stop()


def hosts_toml(
    tmp_path: Path, registry: DockerRegistry, mirror_host: str, scheme: str = "http"
) -> Path:
    """A containerd ``certs.d`` naming ``mirror_host`` (plain HTTP) for the registry."""
    host, port = registry.host.rsplit(":", 1)
    path = tmp_path / "certs.d" / f"{host}_{port}_" / "hosts.toml"
    path.parent.mkdir(parents=True)
    path.write_text(f'server = "{registry.endpoint}"\n[host."{scheme}://{mirror_host}"]\n')
    return path


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    LocalPlanDir(tmp_path / "plans").write(FP, plan_bytes(), None)
    return tmp_path / "ci"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["--json" if a == "JSON" else a for a in argv])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_push_ls_and_verify_read_the_registry_and_never_the_nodes_mirror(
    registry: DockerRegistry,
    mirror: DockerRegistry,
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = registry.url(registry.new_repository("origin"))
    config = ("--storage-option", f"mirror_config={hosts_toml(tmp_path, registry, mirror.host)}")
    before = len(mirror.settled_requests(PLANCACHE_PATHS))
    code, report, err = run(
        capsys, "push", "JSON", "--key", str(keys), *config, str(tmp_path / "plans"), url
    )
    assert code == 0, report
    code, report, err = run(capsys, "ls", "JSON", *config, url)
    assert code == 0 and FP in json.dumps(report["plans"])
    code, report, err = run(capsys, "verify", "JSON", "--trusted-keys", f"{keys}.pub", *config, url)
    assert code == 0, report
    assert len(mirror.settled_requests(PLANCACHE_PATHS)) == before  # not one request
    assert "via_mirror" not in report and "via mirror" not in err
    # a push decides from the registry even when told mirror_reads=true (that is for audits)
    LocalPlanDir(tmp_path / "plans").write(FP2, plan_bytes(FP2), None)
    opt_in = ("--storage-option", "mirror_reads=true")
    plans = str(tmp_path / "plans")
    code, report, err = run(
        capsys, "push", "JSON", "--key", str(keys), *config, *opt_in, plans, url
    )
    assert code == 0 and len(mirror.settled_requests(PLANCACHE_PATHS)) == before, report


def test_reads_through_the_mirror_are_named_in_human_and_json_output(
    registry: DockerRegistry,
    mirror: DockerRegistry,
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = registry.url(registry.new_repository("named"))
    hosts = hosts_toml(tmp_path, registry, mirror.host)
    config = ("--storage-option", f"mirror_config={hosts}")
    assert main(["push", "--key", str(keys), *config, str(tmp_path / "plans"), url]) == 0
    before = len(mirror.settled_requests(PLANCACHE_PATHS))
    spot = tmp_path / "spot"
    trust = ("--trusted-keys", f"{keys}.pub")
    code, report, err = run(
        capsys, "pull", "JSON", *trust, "--fingerprint", FP, *config, url, str(spot)
    )
    assert code == 0 and (spot / plan_name(FP)).read_bytes() == plan_bytes()
    named = [{"host": mirror.host, "configured_in": str(hosts)}]
    assert report["via_mirror"] == named
    assert f"read via mirror {mirror.host} (configured in {hosts})" in err
    assert len(mirror.settled_requests(PLANCACHE_PATHS)) > before
    # an audit through the mirror, asked for explicitly, is named the same way
    opt_in = ("--storage-option", "mirror_reads=true")
    code, report, err = run(capsys, "verify", "JSON", *trust, *config, *opt_in, url)
    assert code == 0 and report["via_mirror"] == named and "read via mirror" in err
    # the plugin's boot line names it too (the plugin's process never forgets a mirror it read)
    with caplog.at_level(logging.INFO, logger="vllm.plancache"):
        log_decision(Decision(True, Verdict.APPLIED, "", 1, FP), "store", FP, Stopwatch.started())
        log_decision(Decision(True, Verdict.APPLIED, "", 1, FP), "local", FP, Stopwatch.started())
    store_line, local_line = (r.getMessage() for r in caplog.records[-2:])
    assert f"via_mirror={mirror.host}" in store_line and "via_mirror" not in local_line
    # ... but only for a plan of the store the mirror served: a worker whose plans come from
    # another store (the mirror read was, say, its compile cache's) names no mirror
    for store_url, named_here in ((url, True), (registry.url("elsewhere"), False)):
        boot = Boot(PluginConfig(url=store_url), TrustPolicy.unsigned_local())
        with caplog.at_level(logging.INFO, logger="vllm.plancache"):
            log_decision(
                Decision(True, Verdict.APPLIED, "", 1, FP),
                "store",
                FP,
                Stopwatch.started(),
                boot=boot,
            )
        assert (f"via_mirror={mirror.host}" in caplog.records[-1].getMessage()) is named_here


def test_a_dead_mirror_is_named_with_the_file_that_configured_it(
    registry: DockerRegistry,
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = registry.url(registry.new_repository("dead"))
    dead = f"127.0.0.1:{closed_port()}"
    hosts = hosts_toml(tmp_path, registry, dead)
    config = ("--storage-option", f"mirror_config={hosts}")
    assert main(["push", "--key", str(keys), *config, str(tmp_path / "plans"), url]) == 0
    trust = ("--trusted-keys", f"{keys}.pub")
    spot = str(tmp_path / "spot")
    code, report, err = run(capsys, "pull", "JSON", *trust, "--fingerprint", FP, *config, url, spot)
    assert code != 0
    text = json.dumps(report) + err
    assert f"the mirror {dead} (configured in {hosts}) failed" in text
    # doctor, checking the store a node will read, names it the same way
    monkeypatch.setenv("PLANCACHE_URL", url)
    monkeypatch.setenv("PLANCACHE_STORAGE_OPTIONS", f"mirror_config={hosts}")
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", f"{keys}.pub")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    code, report, err = run(capsys, "doctor", "JSON")
    assert code != 0 and f"the mirror {dead} (configured in {hosts}) failed" in json.dumps(report)


def test_a_plain_mirror_named_as_tls_names_its_own_fix_not_plain_http(
    registry: DockerRegistry,
    mirror: DockerRegistry,
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The mirror's scheme is its file's: the fix is ``http://`` there, not ``plain_http=true``
    (which is the registry's own option)."""
    url = registry.url(registry.new_repository("tls-mistake"))
    hosts = hosts_toml(tmp_path, registry, mirror.host, scheme="https")
    config = ("--storage-option", f"mirror_config={hosts}")
    assert main(["push", "--key", str(keys), *config, str(tmp_path / "plans"), url]) == 0
    trust = ("--trusted-keys", f"{keys}.pub")
    spot = str(tmp_path / "spot")
    code, report, _ = run(capsys, "pull", "JSON", *trust, "--fingerprint", FP, *config, url, spot)
    text = json.dumps(report)
    assert code != 0 and f"the mirror {mirror.host} (configured in {hosts})" in text
    assert f"name it http://{mirror.host} there" in text and "plain_http=true" not in text


def test_a_prune_that_deletes_judges_from_the_registry_even_with_mirror_reads_true(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mirror whose tag list leaves out one plan of a plan set (stale, or hostile: a stub on
    127.0.0.2 serving the registry's objects but that tag): a prune told ``mirror_reads=true``
    that should delete nothing judged the set as holding a plan the store no longer lists and
    deleted the set on the registry. A prune that deletes reads the registry itself, whatever it
    is told (as a push does); ``--dry-run`` may still audit through the mirror, named."""
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    signer = load_signer(str(tmp_path / "ci"))
    when = utcnow() - timedelta(hours=1)
    members, objects = [], {}
    for rank, fp in enumerate((FP, FP2)):
        data = plan_bytes(fp)
        provenance = {"rank": rank, "world_size": 2}
        sig = sign_plan(plan_name(fp), data, signer, when, provenance=provenance)
        members.append((fp, data, sig))
        objects |= {plan_name(fp): data, sig_name(fp): sig}
    set_name, set_data = build_set(members, signer, when)
    objects[set_name] = set_data
    origin, stale = RegistryStub(), RegistryStub(address="127.0.0.2")
    try:
        for server in (origin, stale):
            store = open_store(server.url("team/plans"), {"mirror_config": "none"}, timeout=30)
            store.put_many(objects)
        stale.state.tags.pop(slot_of(plan_name(FP)).tag)  # the mirror's listing leaves FP out
        held = dict(origin.state.tags)
        prune = ("prune", "JSON", origin.url("team/plans"), "--older-than", "3650d")
        via = ("--storage-option", f"mirror=http://{stale.host}")
        opt_in = ("--storage-option", "mirror_reads=true")
        code, report, err = run(capsys, *prune, "--dry-run", *via, *opt_in)
        assert code == 0 and report["via_mirror"][0]["host"] == stale.host  # an audit: named
        code, report, err = run(capsys, *prune, "--unconditional", *via, *opt_in)
        assert code == 0, report
        assert origin.state.tags == held, "the registry lost " + str(
            set(held) - set(origin.state.tags)
        )
        assert "via_mirror" not in report and "via mirror" not in err
    finally:
        origin.stop()
        stale.stop()
