"""Headers follow their cache (issue 39 item 9): a precompiled header is installed only beside the
cache signature it was made for, bound to that cache's ``archive_sha256`` (no torch: fast).

A header statement bound only to the cache's *name* let a node take an older header beside a
newer cache: ``compile-cache pull`` kept its newer local cache and still installed the store's
header, and a statement from an older plancache (no binding at all) was accepted.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import NOW
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import header_shipping as ch
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.storage.compile_cache import archives
from plancache.storage.compile_cache import header_files as files
from plancache.storage.store import open_store
from plancache.trust import envelope as dsse
from plancache.trust.compile_cache import header_statement as th
from plancache.trust.errors import Reason, Rejected
from plancache.trust.statement import format_time, render_statement
from plancache.vllm_plugin import plugin_state
from plancache.vllm_plugin.compile_cache import boot_headers as plugin_headers
from test_compile_headers import (
    ARCHIVE,
    KEYRING,
    NAME,
    SIGNER,
    SUBJECT,
    build,  # noqa: F401 - a fixture, named as a parameter
    builder_key,
    cache_files,
    cli_pull,
    header_bytes,
    leftovers,
    node,
    pull,
)

OTHER = "cd" * 32
"""The archive sha256 of another signature of the same cache (a newer build, or an older one)."""


def _cache(root: CacheRoot, content: bytes, signed_at: Any) -> str:
    """A signed cache ``SUBJECT`` under ``root`` holding ``content``; its archive sha256."""
    cache_files(root, content)
    return cc.sign_cache(root, SUBJECT, SIGNER, signed_at).archive_sha256


def test_a_pull_that_keeps_a_newer_local_cache_installs_no_older_header(
    build: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built, store = CacheRoot(build[0]), open_store(f"file://{tmp_path}/store")
    # the store's cache and the header made beside it
    older = _cache(built, b"cache A", NOW - timedelta(days=1))
    cc.push_cache(store, built, SUBJECT, KEYRING, NOW - timedelta(days=1))
    ch.push_headers(
        store, SUBJECT, *build, [NAME], SIGNER, NOW - timedelta(days=1), cache_archive_sha256=older
    )
    serving = CacheRoot(tmp_path / "serving")
    newer = _cache(serving, b"cache B", NOW)  # this node's own, signed later: kept
    assert newer != older
    trusted, url = builder_key(tmp_path), f"file://{tmp_path}/store"
    row = cli_pull(capsys, trusted, url, serving.root)
    assert row["action"] == "kept" and "headers: rejected (statement-mismatch" in row["detail"], row
    # old code: the older header installed
    assert leftovers(serving.root / "plancache-private" / "headers") == []
    # a node that pulls cache A gets A's header
    fresh = cli_pull(capsys, trusted, url, tmp_path / "fresh")
    assert fresh["action"] == "pulled" and "headers: installed 1" in fresh["detail"], fresh
    headers = tmp_path / "fresh" / "plancache-private" / "headers"
    assert (headers / NAME).read_bytes() == header_bytes()


def _unbound_statement(store: Any) -> None:
    """The headers as an older plancache signed them: the same statement, no
    ``cache_archive_sha256``."""
    data = zlib.compress(header_bytes(), 1, wbits=31)
    digest = hashlib.sha256(data).hexdigest()
    predicate = {
        "expires_at": None,
        "headers": [[NAME, len(header_bytes()), hashlib.sha256(header_bytes()).hexdigest()]],
        "object": {"sha256": digest, "size": len(data)},
        "signed_at": format_time(NOW),
    }
    payload = render_statement(
        SUBJECT, sha256=digest, predicate_type=th.PREDICATE_TYPE, predicate=predicate
    )
    signature = dsse.Signature(SIGNER.keyid, SIGNER.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload)))
    archives.put_object(store, archives.headers_name(SUBJECT), data)
    archives.put_object(
        store,
        archives.headers_sig_name(SUBJECT),
        dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, payload, (signature,))),
    )


def test_a_statement_without_the_binding_is_refused_and_nothing_is_installed(
    tmp_path: Path,
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    _unbound_statement(store)
    for bound, cancel in ((ARCHIVE, None), (None, ch.Cancel(held=True))):
        if cancel is not None:
            cancel.release(ARCHIVE)
        serving = node(tmp_path, f"serving-{bound}")
        outcome = pull(store, serving, cache_archive_sha256=bound, cancel=cancel)
        # old code: installed
        assert outcome.action == "rejected" and outcome.reason == "statement-mismatch", outcome
        assert "binds no cache" in outcome.detail and leftovers(serving[1]) == []
    sig = (tmp_path / "store" / archives.headers_sig_name(SUBJECT)).read_bytes()
    with pytest.raises(Rejected) as refused:
        # refused before any binding check
        th.verify_headers(SUBJECT, sig, KEYRING, NOW, cache_archive_sha256=None)
    assert refused.value.reason is Reason.STATEMENT_MISMATCH


def test_a_statement_with_a_key_beyond_the_binding_is_still_malformed() -> None:
    hset = th.HeaderSet(
        SUBJECT,
        (th.HeaderEntry(NAME, 1, "0" * 64),),
        "1" * 64,
        1,
        NOW,
        cache_archive_sha256=ARCHIVE,
    )
    payload = json.loads(hset.to_json_bytes())
    assert payload["predicate"]["cache_archive_sha256"] == ARCHIVE
    payload["predicate"]["later"] = True
    with pytest.raises(Rejected) as refused:
        th.parse_headers(json.dumps(payload).encode())
    assert refused.value.reason is Reason.MALFORMED  # strict as before: unknown keys are refused
    with pytest.raises(Rejected, match="archive sha256"):
        th.sign_headers(
            th.HeaderSet(SUBJECT, hset.headers, "1" * 64, 1, NOW, cache_archive_sha256="x"), SIGNER
        )


def test_a_header_bound_to_another_cache_signature_is_refused_before_its_object_is_fetched(
    build: tuple[Path, Path], tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    ch.push_headers(store, SUBJECT, *build, [NAME], SIGNER, NOW, cache_archive_sha256=ARCHIVE)
    # refused on the statement: no object GET
    (tmp_path / "store" / archives.headers_name(SUBJECT)).unlink()
    serving = node(tmp_path, "serving")
    outcome = pull(store, serving, cache_archive_sha256=OTHER)
    assert outcome.action == "rejected" and outcome.reason == "statement-mismatch", outcome
    assert leftovers(serving[1]) == []
    sig = (tmp_path / "store" / archives.headers_sig_name(SUBJECT)).read_bytes()
    with pytest.raises(Rejected) as refused:
        th.verify_headers(SUBJECT, sig, KEYRING, NOW, cache_archive_sha256=OTHER)
    assert refused.value.reason is Reason.STATEMENT_MISMATCH
    assert (
        th.verify_headers(
            SUBJECT, sig, KEYRING, NOW, cache_archive_sha256=ARCHIVE
        ).headers.cache_archive_sha256
        == ARCHIVE
    )


@pytest.fixture
def plugin(build: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The plugin's held fetch beside the guard's pull, against a store with ``ARCHIVE``'s
    header (a boot of its own, as a forked worker starts one; torch's headers pinned nowhere
    yet)."""
    plugin_state.start_boot()
    monkeypatch.setattr(plugin_state.current().installed, "headers_at", None)
    store = open_store(f"file://{tmp_path}/store")
    ch.push_headers(store, SUBJECT, *build, [NAME], SIGNER, NOW, cache_archive_sha256=ARCHIVE)
    yield SimpleNamespace(
        store=store,
        config=SimpleNamespace(
            url=f"file://{tmp_path}/store", storage_options={}, timeout=10.0, keyring=KEYRING
        ),
    )
    plugin_state.start_boot()


@pytest.mark.parametrize("loaded", [ARCHIVE, OTHER, None])
def test_the_held_fetch_links_only_for_the_cache_the_guard_loaded(
    plugin: Any, tmp_path: Path, loaded: str | None
) -> None:
    base = tmp_path / f"serving-{loaded}"
    directory = files.private_dir(base / "plancache-private")
    plugin_headers.place(base, directory)
    plugin_headers.start_fetch(plugin.config, SUBJECT, plugin.store, held=True)
    fetch = plugin_state.current().headers.fetch[0]
    end = time.monotonic() + 10
    while not any(n.endswith(".tmp") for n in leftovers(directory)) and time.monotonic() < end:
        time.sleep(0.01)  # verified and inflated, held for the decision
    plugin_headers.decided(SUBJECT, True, archive_sha256=loaded)
    finished, outcome = fetch.result()
    assert finished
    if loaded == ARCHIVE:
        assert outcome.action == "installed" and (directory / NAME).read_bytes() == header_bytes()
    else:  # another signature of the cache was loaded, or the guard named none: nothing linked
        # old code: installed
        assert outcome.action == "rejected" and outcome.reason == "statement-mismatch", outcome
        assert leftovers(directory) == []
