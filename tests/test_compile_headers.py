"""A pulled cache's precompiled headers: shipped signed and compressed, installed verified (no
torch: fast).

Each rule on its own, on synthetic headers: the round trip, tampering, gzip bombs and
oversize claims, links at the install path, an older store without header objects, the
budget, and the plugin's wrapper of torch's ``_precompile_header`` (counts, never timings).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import time
import zlib
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import NOW, keyring_of, make_signer
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import header_shipping as ch
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.storage.compile_cache import archives
from plancache.storage.compile_cache import header_files as files
from plancache.storage.store import open_store
from plancache.trust.compile_cache import header_statement as th
from plancache.trust.errors import Rejected
from plancache.vllm_plugin import plugin_state
from plancache.vllm_plugin.compile_cache import boot_headers as plugin_headers
from plancache.vllm_plugin.compile_cache import guard_settings

SUBJECT = "torch_aot_compile/" + "cd" * 32
NAME = "cabcdefghijklmnop0123456789.h.gch"
SIGNER = make_signer()
KEYRING = keyring_of(SIGNER)
ARCHIVE = "ab" * 32
"""The archive sha256 of the cache the synthetic headers are bound to (a real one where a cache is
made)."""


def header_bytes(size: int = 3 << 20) -> bytes:
    """Compressible like a .gch (repetitive with noise), several inflate chunks long, beginning
    with g++'s ident as a whole one does (the plugin removes a header that does not: gcc's
    unfinished file)."""
    noise = random.Random(0).randbytes(size // 2)
    body = b"".join(noise[i : i + 4096] + bytes(4096) for i in range(0, len(noise), 4096))
    return (b"gpch+014" + body)[:size]


@pytest.fixture
def build(tmp_path: Path) -> tuple[Path, Path]:
    """A build node's root and its private headers directory holding one header."""
    base = tmp_path / "build"
    directory = files.private_dir(base / "plancache-private")
    assert directory is not None
    (directory / NAME).write_bytes(header_bytes())
    # torch's .h: not shipped
    (directory / (NAME[:-4])).write_text("#include <torch/csrc/inductor/cpp_prefix.h>\n")
    return base, directory


def node(tmp_path: Path, name: str) -> tuple[Path, Path]:
    base = tmp_path / name
    return base, base / "plancache-private" / "headers"


def pushed(build: tuple[Path, Path], tmp_path: Path) -> Any:
    store = open_store(f"file://{tmp_path}/store")
    outcome = ch.push_headers(
        store, SUBJECT, *build, [NAME, "not a header"], SIGNER, NOW, cache_archive_sha256=ARCHIVE
    )
    assert outcome.action == "pushed" and outcome.installed == (NAME,)
    assert 0 < outcome.size < len(header_bytes())  # compressed
    return store


def pull(
    store: Any, where: tuple[Path, Path], keyring: Any = KEYRING, **kw: Any
) -> ch.HeadersOutcome:
    kw.setdefault("cache_archive_sha256", ARCHIVE)
    return ch.pull_headers(store, SUBJECT, keyring, NOW, where[0], where[1], **kw)


def header_lines(lines: list[str]) -> list[str]:
    """The plugin's ``header=`` lines, each without its ``waited_ms`` (checked: a whole number)."""
    found = [line for line in lines if "compile-cache header=" in line]
    assert all(re.search(r" waited_ms=\d+$", line) for line in found), found
    return [re.sub(r" waited_ms=\d+$", "", line) for line in found]


def waited_ms(lines: list[str]) -> int:
    return int(
        next(
            re.search(r" waited_ms=(\d+)$", line)[1]
            for line in lines
            if "compile-cache header=" in line
        )
    )


def leftovers(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


def cache_files(root: CacheRoot, content: bytes = b"model") -> None:
    """The files of cache ``SUBJECT`` under ``root``: one rank's ``model``, holding ``content``."""
    (root.directory(SUBJECT) / "rank_0_0").mkdir(parents=True, exist_ok=True)
    (root.directory(SUBJECT) / "rank_0_0" / "model").write_bytes(content)


def builder_key(tmp_path: Path) -> Path:
    """SIGNER's public key, as a node's ``--trusted-keys`` file."""
    from plancache.trust.keyring.keyformat import openssh_line

    (tmp_path / "k.pub").write_text(openssh_line(SIGNER.public, "builder") + "\n")
    return tmp_path / "k.pub"


def cli_pull(
    capsys: pytest.CaptureFixture[str], trusted: Path, store: str, into: Path
) -> dict[str, Any]:
    """``compile-cache pull --json --trusted-keys trusted store into`` (it succeeds): the row of
    the cache."""
    capsys.readouterr()
    code = main(
        ["compile-cache", "pull", "--json", "--trusted-keys", str(trusted), store, str(into)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)["caches"][0]


def test_round_trip_installs_exactly_the_signed_bytes_and_never_fetches_twice(
    build: tuple[Path, Path], tmp_path: Path
) -> None:
    store = pushed(build, tmp_path)
    serving = node(tmp_path, "serving")
    outcome = pull(store, serving)
    assert (
        outcome.action == "installed"
        and outcome.installed == (NAME,)
        and outcome.size == len(header_bytes())
    )
    assert (serving[1] / NAME).read_bytes() == header_bytes()
    assert leftovers(serving[1]) == [NAME]  # no temporary left, nothing but the header
    assert os.stat(serving[1]).st_mode & 0o777 == 0o700
    # present: only the signature is read
    (tmp_path / "store" / archives.headers_name(SUBJECT)).unlink()
    again = pull(store, serving)
    assert again.action == "present" and again.present == (NAME,) and again.installed == ()


@pytest.mark.parametrize("tamper", ["object", "signature", "other-key", "other-cache"])
def test_tampered_headers_are_refused_and_nothing_is_installed(
    build: tuple[Path, Path], tmp_path: Path, tamper: str
) -> None:
    store = pushed(build, tmp_path)
    obj, sig = (
        tmp_path / "store" / archives.headers_name(SUBJECT),
        tmp_path / "store" / archives.headers_sig_name(SUBJECT),
    )
    keyring = KEYRING
    if tamper == "object":
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 1
        obj.write_bytes(bytes(data))
    elif tamper == "signature":
        sig.write_bytes(sig.read_bytes().replace(b'"sig":"', b'"sig":"A', 1))
    elif tamper == "other-key":
        keyring = keyring_of(make_signer())
    else:  # a statement signed for another cache, renamed into this one's place
        other = "torch_aot_compile/" + "ef" * 32
        ch.push_headers(store, other, *build, [NAME], SIGNER, NOW, cache_archive_sha256=ARCHIVE)
        sig.write_bytes((tmp_path / "store" / archives.headers_sig_name(other)).read_bytes())
    serving = node(tmp_path, "serving")
    outcome = pull(store, serving, keyring)
    assert outcome.action == "rejected", outcome
    assert outcome.reason in (
        "digest-mismatch",
        "bad-signature",
        "untrusted-key",
        "malformed",
        "name-mismatch",
    )
    assert leftovers(serving[1]) == []


def _signed_object(store: Any, data: bytes, size: int, header: bytes | None = None) -> None:
    """A statement signed by the *trusted* key for ``data`` claiming one header of ``size``:
    the worst case, a hostile or broken signer (a store alone cannot get past the digests)."""
    real = hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256(header if header is not None else header_bytes()).hexdigest()
    hset = th.HeaderSet(
        SUBJECT,
        (th.HeaderEntry(NAME, size, digest),),
        real,
        len(data),
        NOW,
        cache_archive_sha256=ARCHIVE,
    )
    archives.put_object(store, archives.headers_name(SUBJECT), data)
    archives.put_object(store, archives.headers_sig_name(SUBJECT), th.sign_headers(hset, SIGNER))


def test_a_gzip_bomb_is_cut_at_the_signed_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    bomb = zlib.compress(bytes(64 << 20), 9, wbits=31)  # 64 MiB of zeros in ~64 KB
    # claims the first 1 MiB (a ratio the caps allow)
    _signed_object(store, bomb, 1 << 20, bytes(1 << 20))
    written: list[int] = []
    real_write = os.write
    monkeypatch.setattr(
        files.os, "write", lambda fd, b: written.append(len(b)) or real_write(fd, b)
    )
    serving = node(tmp_path, "serving")
    outcome = pull(store, serving)
    assert outcome.action == "rejected" and outcome.reason == "too-large", outcome
    assert leftovers(serving[1]) == []
    # inflated no further than the signed size (then one chunk, discarded)
    assert sum(written) == 1 << 20


def test_oversize_and_overcompressed_claims_are_refused_before_any_inflating(
    tmp_path: Path,
) -> None:
    entry = th.HeaderEntry(NAME, th.MAX_HEADER_BYTES + 1, "0" * 64)
    with pytest.raises(Rejected, match="header size"):
        th.sign_headers(
            th.HeaderSet(SUBJECT, (entry,), "0" * 64, 1 << 20, NOW, cache_archive_sha256=ARCHIVE),
            SIGNER,
        )
    ratio = th.HeaderSet(
        SUBJECT,
        (th.HeaderEntry(NAME, 1 << 30, "0" * 64),),
        "0" * 64,
        1024,
        NOW,
        cache_archive_sha256=ARCHIVE,
    )
    with pytest.raises(Rejected, match="gzip bomb"):
        th.sign_headers(ratio, SIGNER)
    for bad in ("../x.h.gch", "a/b.h.gch", ".h.gch", "x.so"):
        with pytest.raises(Rejected):
            th.sign_headers(
                th.HeaderSet(
                    SUBJECT,
                    (th.HeaderEntry(bad, 1, "0" * 64),),
                    "0" * 64,
                    1,
                    NOW,
                    cache_archive_sha256=ARCHIVE,
                ),
                SIGNER,
            )
    store = open_store(f"file://{tmp_path}/store")
    data = zlib.compress(header_bytes(), 1, wbits=31)
    _signed_object(store, data, len(header_bytes()))
    # more than signed
    (tmp_path / "store" / archives.headers_name(SUBJECT)).write_bytes(data + b"x" * 100)
    outcome = pull(store, node(tmp_path, "serving"))
    assert outcome.action == "rejected" and outcome.reason == "too-large"  # the capped GET
    short = zlib.compress(header_bytes(), 1, wbits=31)
    _signed_object(store, short, len(header_bytes()) + 1)  # the stream ends early
    assert pull(store, node(tmp_path, "short")).reason == "digest-mismatch"
    trailing = zlib.compress(header_bytes(), 1, wbits=31) + zlib.compress(b"more", 1, wbits=31)
    # a second gzip member after the signed bytes
    _signed_object(store, trailing, len(header_bytes()))
    assert pull(store, node(tmp_path, "trailing")).action == "rejected"


def test_a_link_at_the_install_path_or_for_the_directory_is_never_followed(
    build: tuple[Path, Path], tmp_path: Path
) -> None:
    store = pushed(build, tmp_path)
    serving = node(tmp_path, "serving")
    serving[1].mkdir(parents=True, mode=0o700)
    os.chmod(serving[1].parent, 0o700)
    target = tmp_path / "elsewhere.gch"
    (serving[1] / NAME).symlink_to(target)
    outcome = pull(store, serving)
    assert outcome.action == "present" and "link" in outcome.detail and not target.exists()
    assert (serving[1] / NAME).is_symlink() and leftovers(serving[1]) == [NAME]
    linked = node(tmp_path, "linked")
    linked[1].parent.mkdir(parents=True)
    (tmp_path / "victim").mkdir(mode=0o700)
    linked[1].symlink_to(tmp_path / "victim")
    outcome = pull(store, linked)
    assert outcome.action == "failed" and "not followed" in outcome.detail
    assert leftovers(tmp_path / "victim") == []
    assert files.private_dir(linked[1].parent) is None  # and torch is not pinned there either


def test_an_older_store_without_header_objects_still_pulls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    outcome = pull(store, node(tmp_path, "serving"))
    assert outcome.action == "none" and outcome.reason == "no-headers"
    built = CacheRoot(tmp_path / "vllm")
    cache_files(built)
    key = str(tmp_path / "k")
    assert main(["keygen", key]) == 0
    assert main(["compile-cache", "sign", "--key", key, str(built.root)]) == 0
    url = f"file://{tmp_path}/store"
    assert main(["compile-cache", "push", "--key", key, str(built.root), url]) == 0
    row = cli_pull(capsys, tmp_path / "k.pub", url, tmp_path / "fresh")
    assert row["action"] == "pulled" and "headers: none" in row["detail"]


def test_cli_pull_installs_the_headers_beside_the_cache(
    build: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = CacheRoot(build[0])
    cache_files(built)
    store = open_store(f"file://{tmp_path}/store")
    cc.sign_cache(built, SUBJECT, SIGNER, NOW)
    digest = cc.push_cache(store, built, SUBJECT, KEYRING, NOW).archive_sha256
    ch.push_headers(
        store,
        SUBJECT,
        *build,
        [NAME],
        SIGNER,
        NOW,
        cache_archive_sha256=digest,
        expires_in=timedelta(days=3650),
    )
    fresh = tmp_path / "fresh"
    row = cli_pull(capsys, builder_key(tmp_path), f"file://{tmp_path}/store", fresh)
    assert row["action"] == "pulled" and "headers: installed 1" in row["detail"], row
    assert (fresh / "plancache-private" / "headers" / NAME).read_bytes() == header_bytes()


def test_past_the_budget_or_cancelled_nothing_is_installed(
    build: tuple[Path, Path], tmp_path: Path
) -> None:
    store = pushed(build, tmp_path)
    late = node(tmp_path, "late")
    outcome = pull(store, late, deadline=Deadline.after(-1))
    assert outcome.action == "failed" and outcome.reason == "timeout", outcome
    cancel = ch.Cancel()
    cancel.set()
    cancelled = node(tmp_path, "cancelled")
    outcome = pull(store, cancelled, cancel=cancel)
    assert (
        outcome.action == "failed" and outcome.reason == "timeout" and leftovers(cancelled[1]) == []
    )


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boot of its own, as a forked worker starts one; torch's headers pinned nowhere yet."""
    plugin_state.start_boot()
    monkeypatch.setattr(plugin_state.current().installed, "headers_at", None)
    yield plugin_headers
    plugin_state.start_boot()


def fake_torch(directory: Path, built: list[str]) -> Any:
    """torch's ``_precompile_header``: gcc builds ``<name>.gch`` when it is missing."""

    def precompile(header: str, cmd: str, **options: Any) -> str:
        path = directory / NAME[:-4]
        if not (directory / NAME).exists():
            built.append(NAME)
            (directory / NAME).write_bytes(b"gpch+014 built here")
        return str(path)

    return precompile


def test_plugin_waits_for_the_fetch_and_torch_builds_nothing(
    plugin: Any, build: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = pushed(build, tmp_path)
    base, directory = node(tmp_path, "serving")
    directory = files.private_dir(base / "plancache-private")
    plugin.place(base, directory)
    config = SimpleNamespace(
        url=f"file://{tmp_path}/store", storage_options={}, timeout=3.0, keyring=KEYRING
    )
    built: list[str] = []
    wrapped = plugin.wrap(fake_torch(directory, built))
    with caplog.at_level(logging.INFO, "vllm.plancache"):
        plugin.start_fetch(config, SUBJECT, open_store(config.url), archive_sha256=ARCHIVE)
        # once a boot
        plugin.start_fetch(config, SUBJECT, open_store(config.url), archive_sha256=ARCHIVE)
        for _ in range(3):
            assert wrapped("torch/csrc/inductor/cpp_prefix.h", "g++ -O3") == str(
                directory / NAME[:-4]
            )
    assert built == [] and (directory / NAME).read_bytes() == header_bytes()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("headers=installed" in line for line in lines) == 1, lines
    assert header_lines(lines) == [f"plancache: compile-cache header={NAME} source=store"]
    assert plugin.used() == [NAME] and store is not None


def test_plugin_past_the_budget_builds_and_logs_it(
    plugin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = node(tmp_path, "slow")
    directory = files.private_dir(base / "plancache-private")
    plugin.place(base, directory)
    monkeypatch.setattr(plugin, "HEADERS_TIMEOUT", 0.2)
    seen: list[Any] = []

    def slow(*args: Any, **kwargs: Any) -> ch.HeadersOutcome:
        seen.append(kwargs.get("cancel") or args[-1])
        time.sleep(1.0)
        return ch.HeadersOutcome("failed", "timeout")

    monkeypatch.setattr(ch, "pull_headers", slow)
    config = SimpleNamespace(
        url=f"file://{tmp_path}/store", storage_options={}, timeout=0.1, keyring=KEYRING
    )
    built: list[str] = []
    with caplog.at_level(logging.INFO, "vllm.plancache"):
        plugin.start_fetch(config, SUBJECT, open_store(config.url))
        plugin.wrap(fake_torch(directory, built))("h", "cmd")
    assert built == [NAME]
    with seen[0].unless_cancelled() as going_on:
        assert not going_on  # a late fetch installs nothing
    lines = [r.getMessage() for r in caplog.records]
    assert any("headers=failed reason=timeout" in line for line in lines), lines
    assert header_lines(lines) == [f"plancache: compile-cache header={NAME} source=built"]
    # torch waited out the fetch's 0.2 s budget, and the line says so
    assert waited_ms(lines) >= 100


def test_build_node_publish_pushes_the_cache_then_its_headers_packed_early(
    plugin: Any, build: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plancache.vllm_plugin.compile_cache import publish as compile_publish

    base, directory = build
    root = CacheRoot(base)
    (root.directory(SUBJECT) / "rank_0_0").mkdir(parents=True)
    (root.directory(SUBJECT) / "rank_0_0" / "model").write_bytes(b"model")
    digest = cc.sign_cache(root, SUBJECT, SIGNER, NOW).archive_sha256
    config = guard_settings.Settings(KEYRING, "", "key", f"file://{tmp_path}/store", {}, 3.0)
    plugin_state.current().guard.settings = (config,)  # as this boot read them: a build node
    monkeypatch.setattr("plancache.pipeline.resolver.utcnow", lambda: NOW)
    plugin.place(base, directory)
    (directory / NAME).unlink()
    packs: list[list[str]] = []
    real_pack = ch.pack_headers
    monkeypatch.setattr(ch, "pack_headers", lambda *a: packs.append(a[2]) or real_pack(*a))
    # gcc builds it: packed now
    plugin.wrap(fake_torch(directory, []))("torch/csrc/inductor/cpp_prefix.h", "g++")
    compile_publish._push_in_background(config, root, SUBJECT, SIGNER)
    compile_publish._finish_pushes(plugin_state.current().guard.pushes)
    assert packs == [[NAME]]  # once, when it was built; the push reused it
    names = sorted(
        p.relative_to(tmp_path / "store").as_posix()
        for p in (tmp_path / "store").rglob("*")
        if p.is_file()
    )
    assert names == [
        f"torch_compile_cache/{SUBJECT}{end}"
        for end in (".pch.gz", ".pch.gz.sig", ".tar", ".tar.sig")
    ]
    serving = node(tmp_path, "serving")
    # bound to the cache pushed
    outcome = pull(open_store(f"file://{tmp_path}/store"), serving, cache_archive_sha256=digest)
    assert (
        outcome.installed == (NAME,) and (serving[1] / NAME).read_bytes() == b"gpch+014 built here"
    )


def test_every_thread_asking_for_a_header_waits_for_the_same_fetch(
    plugin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor compiles on a thread pool: a second thread must not have gcc build the header
    meanwhile."""
    import threading

    base, _ = node(tmp_path, "pool")
    directory = files.private_dir(base / "plancache-private")
    plugin.place(base, directory)

    def fetched(*args: Any, **kwargs: Any) -> ch.HeadersOutcome:
        time.sleep(0.5)
        (directory / NAME).write_bytes(b"gpch+014 from the store")
        return ch.HeadersOutcome("installed", installed=(NAME,))

    monkeypatch.setattr(ch, "pull_headers", fetched)
    config = SimpleNamespace(
        url=f"file://{tmp_path}/store", storage_options={}, timeout=30.0, keyring=KEYRING
    )
    built: list[str] = []
    wrapped = plugin.wrap(fake_torch(directory, built))
    plugin.start_fetch(config, SUBJECT, open_store(config.url))
    threads = [threading.Thread(target=wrapped, args=("h", f"cmd{i}")) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == [] and (directory / NAME).read_bytes() == b"gpch+014 from the store"


# -- the fetch beside the guard's pull (issue 23 item 6) ------------------------------------------


@pytest.fixture
def boot(
    plugin: Any, build: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """A build node's signed cache and header in a ``file://`` store, and a new serving node whose
    guard (the plugin's own ``_check``, vLLM's boot directory stood in for) is about to pull it."""
    from plancache.vllm_plugin.compile_cache import guarded_dirs, torch_caches

    built = CacheRoot(build[0])
    (built.directory(SUBJECT) / "rank_0_0").mkdir(parents=True)
    (built.directory(SUBJECT) / "rank_0_0" / "model").write_bytes(b"model" * 1000)
    store = open_store(f"file://{tmp_path}/store")
    cc.sign_cache(built, SUBJECT, SIGNER, NOW)
    digest = cc.push_cache(store, built, SUBJECT, KEYRING, NOW).archive_sha256
    ch.push_headers(store, SUBJECT, *build, [NAME], SIGNER, NOW, cache_archive_sha256=digest)
    base = tmp_path / "serving"
    directory = files.private_dir(base / "plancache-private")
    plugin.place(base, directory)
    (base / "boot").mkdir(mode=0o700)
    monkeypatch.setattr(torch_caches, "private_dir", lambda name: base / "boot" / name)
    config = guard_settings.Settings(KEYRING, "", None, f"file://{tmp_path}/store", {}, 30.0)
    plugin_state.current().guard.settings = (config,)  # as this boot read them
    monkeypatch.setattr("plancache.pipeline.resolver.utcnow", lambda: NOW)
    opened: list[Any] = []
    real_open = open_store
    monkeypatch.setattr(
        "plancache.storage.store.open_store", lambda *a, **k: opened.append(a) or real_open(*a, **k)
    )
    return SimpleNamespace(
        guard=guarded_dirs,
        directory=CacheRoot(base).directory(SUBJECT),
        headers=directory,
        store=tmp_path / "store",
        opened=opened,
    )


def _requests(monkeypatch: pytest.MonkeyPatch, before: Any = None) -> list[str]:
    """The names of the store objects read, in order (``before(name)`` runs ahead of each read)."""
    asked: list[str] = []
    real_get = archives.get_object

    def get(store: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(name)
        asked.append(name)
        return real_get(store, name, *args, **kwargs)

    monkeypatch.setattr(archives, "get_object", get)
    return asked


def _until(condition: Any, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return bool(condition())


def test_the_header_fetch_starts_with_the_pull_on_the_guards_store_before_the_archive_is_installed(
    boot: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from plancache.storage.compile_cache import cachedir

    asked = _requests(monkeypatch)
    seen_at_install: list[list[str]] = []
    real_install = cachedir.install

    # the pulled archive, verified, about to go into place
    def install(*args: Any, **kwargs: Any) -> Any:
        _until(lambda: archives.headers_sig_name(SUBJECT) in asked)
        seen_at_install.append(list(asked))
        return real_install(*args, **kwargs)

    monkeypatch.setattr(cachedir, "install", install)
    built: list[str] = []
    with caplog.at_level(logging.INFO, "vllm.plancache"):
        _, outcome = boot.guard.private_for(boot.directory)
        assert outcome.action == "load", outcome
        plugin_headers.wrap(fake_torch(boot.headers, built))("h", "cmd")
    # old code: fetched only after the guard returned
    assert archives.headers_sig_name(SUBJECT) in seen_at_install[0]
    # the header came through the guard's own store (old code: a second one)
    assert len(boot.opened) == 1
    assert built == [] and (boot.headers / NAME).read_bytes() == header_bytes()
    assert header_lines([r.getMessage() for r in caplog.records]) == [
        f"plancache: compile-cache header={NAME} source=store"
    ]


@pytest.mark.parametrize("refusal", ["tampered-archive", "expired-cache"])
def test_a_cache_refused_after_its_header_verified_installs_no_header_and_torch_does_not_wait(
    boot: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    """The header verifies on its own signature and is inflated, held, while the guard still pulls;
    the guard then refuses the cache: the header is cancelled, never linked, its temporary
    removed."""
    archive = boot.store / archives.archive_name(SUBJECT)
    if refusal == "tampered-archive":
        data = bytearray(archive.read_bytes())
        data[len(data) // 2] ^= 1
        archive.write_bytes(bytes(data))
    else:  # a cache signed to expire before now, beside a header whose statement does not
        old = CacheRoot(boot.store.parent / "build")
        cc.sign_cache(old, SUBJECT, SIGNER, NOW - timedelta(days=2), expires_in=timedelta(days=1))
        cc.push_cache(
            open_store(f"file://{boot.store}"), old, SUBJECT, KEYRING, NOW - timedelta(days=2)
        )
    fetches: list[Any] = []

    # the guard's first GET waits for the header's inflate
    def held_until_inflated(name: str) -> None:
        if name == archives.sig_name(SUBJECT):
            fetches.append(plugin_state.current().headers.fetch)
            assert _until(
                lambda: any(
                    n.endswith(".tmp") and os.stat(boot.headers / n).st_size == len(header_bytes())
                    for n in os.listdir(boot.headers)
                )
            )

    _requests(monkeypatch, held_until_inflated)
    built: list[str] = []
    with caplog.at_level(logging.INFO, "vllm.plancache"):
        _, outcome = boot.guard.private_for(boot.directory)
        started = time.monotonic()
        plugin_headers.wrap(fake_torch(boot.headers, built))("h", "cmd")
        waited = time.monotonic() - started
        # old code: no fetch had started at the cache's GET
        assert fetches and fetches[0] is not None
        finished, fetched = fetches[0][0].result()
    assert outcome.action == "compile" and outcome.reason in ("store-rejected", "expired"), outcome
    assert finished and fetched.action == "cancelled" and fetched.installed == ()
    # gcc's, not the store's
    assert built == [NAME] and (boot.headers / NAME).read_bytes() == b"gpch+014 built here"
    # no temporary left; torch did not wait out the budget
    assert leftovers(boot.headers) == [NAME] and waited < 5
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"headers=cancelled reason={outcome.reason}" in line for line in lines), lines
    assert header_lines(lines) == [f"plancache: compile-cache header={NAME} source=built"]


def test_a_cancelled_fetch_stops_at_its_next_piece(
    build: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = pushed(build, tmp_path)
    cancel = ch.Cancel()
    written: list[int] = []
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        written.append(len(data))
        # the guard refused the cache meanwhile
        cancel.set(ch.HeadersOutcome("cancelled", "store-rejected"))
        return real_write(fd, data)

    monkeypatch.setattr(files.os, "write", write)
    serving = node(tmp_path, "serving")
    outcome = pull(store, serving, cancel=cancel)
    assert outcome.action == "cancelled" and outcome.reason == "store-rejected", outcome
    # old code: inflated it all, then refused to link
    assert 0 < sum(written) <= 2 * files.CHUNK < len(header_bytes())
    assert leftovers(serving[1]) == []


def test_a_get_that_fails_after_the_cancel_ends_as_cancelled(
    build: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard refused the cache while the header's object GET was in flight (a black hole)."""
    from plancache.trust.errors import StoreTimeout

    store = pushed(build, tmp_path)
    cancel, real_get = ch.Cancel(held=True), archives.get_object

    def get(store: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == archives.headers_name(SUBJECT):
            cancel.set(ch.HeadersOutcome("cancelled", "timeout", "the cache was not loaded"))
            raise StoreTimeout("no answer within the budget")
        return real_get(store, name, *args, **kwargs)

    monkeypatch.setattr(archives, "get_object", get)
    outcome = pull(store, node(tmp_path, "serving"), cancel=cancel)
    assert outcome.action == "cancelled", outcome  # not a header failure of its own


def test_a_held_fetch_links_only_once_released_and_nothing_when_never_decided(
    build: tuple[Path, Path], tmp_path: Path
) -> None:
    import threading

    store = pushed(build, tmp_path)
    undecided = node(tmp_path, "undecided")
    outcome = pull(store, undecided, cancel=ch.Cancel(held=True), deadline=Deadline.after(0.5))
    assert (
        outcome.action == "failed" and outcome.reason == "timeout" and leftovers(undecided[1]) == []
    )
    cancel, serving = ch.Cancel(held=True), node(tmp_path, "serving")
    result: list[ch.HeadersOutcome] = []
    thread = threading.Thread(
        target=lambda: result.append(pull(store, serving, cancel=cancel, cache_archive_sha256=None))
    )
    thread.start()
    assert _until(
        lambda: serving[1].exists() and any(n.endswith(".tmp") for n in os.listdir(serving[1]))
    )
    assert not (serving[1] / NAME).exists()  # verified, held: not linked yet
    cancel.release(ARCHIVE)
    thread.join(10)
    assert result[0].action == "installed" and (serving[1] / NAME).read_bytes() == header_bytes()


def test_a_header_is_on_disk_before_its_name_and_a_writeback_error_installs_nothing(
    build: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early writeback (fdatasync while inflating) must not replace the fsync before the
    link."""
    store = pushed(build, tmp_path)
    monkeypatch.setattr(files, "FLUSH_EVERY", 1 << 20)  # the 3 MiB header: early writebacks too
    calls: list[tuple[str, str]] = []
    real_fsync, real_fdatasync, real_link = os.fsync, os.fdatasync, os.link

    def named(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(
        files.os, "fsync", lambda fd: calls.append(("fsync", named(fd))) or real_fsync(fd)
    )
    monkeypatch.setattr(
        files.os,
        "fdatasync",
        lambda fd: calls.append(("fdatasync", named(fd))) or real_fdatasync(fd),
    )
    monkeypatch.setattr(
        files.os,
        "link",
        lambda src, dst, **kw: calls.append(("link", src)) or real_link(src, dst, **kw),
    )
    serving = node(tmp_path, "serving")
    assert pull(store, serving).action == "installed"
    tmp = next(src for kind, src in calls if kind == "link")
    assert ("fdatasync", tmp) in calls  # writeback started while inflating
    # and the whole file synced before its name
    assert calls.index(("fsync", tmp)) < calls.index(("link", tmp))

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(files.os, "fdatasync", failing)
    broken = node(tmp_path, "broken")
    outcome = pull(store, broken)
    assert outcome.action == "failed" and "Input/output error" in outcome.detail, outcome
    assert leftovers(broken[1]) == []


def test_a_guard_that_fails_after_the_fetch_started_cancels_it(
    boot: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """plancache's own failure mid-pull (``internal-error``): the held fetch must not be left for
    torch to wait out its budget (here 30 s), nor link anything."""
    from plancache.pipeline.compile_cache import load

    def failing_guard(
        root: Any,
        subject: str,
        keyring: Any,
        now: Any,
        into: Path,
        problem: str,
        fetch: Any,
        wait: Any,
    ) -> Any:
        fetch()
        raise RuntimeError("plancache bug")

    monkeypatch.setattr(load, "guard", failing_guard)
    built: list[str] = []
    with caplog.at_level(logging.INFO, "vllm.plancache"):
        _, outcome = boot.guard.private_for(boot.directory)
        fetch = plugin_state.current().headers.fetch
        started = time.monotonic()
        plugin_headers.wrap(fake_torch(boot.headers, built))("h", "cmd")
        assert time.monotonic() - started < 5 and outcome is None and fetch is None
        assert _until(
            lambda: any(
                "headers=cancelled reason=internal-error" in r.getMessage() for r in caplog.records
            )
        )
    assert built == [NAME] and leftovers(boot.headers) == [NAME]
