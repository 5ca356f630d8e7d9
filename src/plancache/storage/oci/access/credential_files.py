"""Registry credentials where registries keep them, read as hostile files and never printed.

Looked up for one registry authority, first match wins:

1. the ``auth_file`` storage option (a docker ``config.json`` or a podman ``auth.json``);
2. ``$REGISTRY_AUTH_FILE`` (podman, skopeo, buildah);
3. docker's ``config.json`` in ``$DOCKER_CONFIG`` (default ``~/.docker``);
4. ``$XDG_RUNTIME_DIR/containers/auth.json`` (podman's default).

In a file: ``credHelpers[authority]``, else an ``auths`` entry for the authority (keys as docker
writes them: ``host``, ``https://host``, ``http://host/v2/``, ...) with ``auth`` (base64
``user:password``) or ``username``/``password`` or ``identitytoken``, else ``credsStore``. A
helper is ``docker-credential-<name> get``, the server URL on stdin, run with a timeout and
its output capped; its stderr is dropped and nothing it says is shown (it may echo secrets).
Anonymous when nothing matches: public registries and mirrors need nothing.

All of it runs off the event loop every store shares (the first request's ``401`` asks for
credentials, under the operation's deadline): a file is read in a worker thread and only if it
is a regular file (a FIFO or a device as ``config.json`` would block for good), capped; a
helper is an asyncio subprocess whose output is read capped as it comes (600 MiB of it costs
:data:`MAX_HELPER_OUTPUT`, not 600 MiB) and which is killed, with its process group (a child
it forked holding the pipe), when it outlives :data:`HELPER_TIMEOUT` or the operation (a
cancelled read kills it too).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....trust.errors import ConfigError, StoreError
from ...local.files import read_config_file

MAX_FILE = 1024 * 1024
MAX_HELPER_OUTPUT = 64 * 1024
HELPER_TIMEOUT = 5.0
REAP_WAIT = 1.0
"""Seconds a killed helper's pipe is drained before it is left to the collector."""
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Credentials:
    """A username and password, or an identity (refresh) token; ``repr`` shows neither."""

    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    source: str = ""
    """Where they came from (a file path or helper name), for messages: never the values."""

    @property
    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


ANONYMOUS = Credentials(source="anonymous")


def candidate_files(auth_file: str | None) -> list[Path]:
    env = os.environ
    docker = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else Path.home() / ".docker"
    files = [
        Path(auth_file).expanduser() if auth_file else None,
        Path(env["REGISTRY_AUTH_FILE"]) if env.get("REGISTRY_AUTH_FILE") else None,
        docker / "config.json",
        Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json"
        if env.get("XDG_RUNTIME_DIR")
        else None,
    ]
    return [f for f in files if f is not None]


def _read_json(path: Path, explicit: bool) -> dict[str, Any] | None:
    """The file's JSON object, read by :func:`...local.files.read_config_file` (a regular file
    only, never blocking on a FIFO, capped); None if absent (ConfigError if ``explicit``)."""
    raw = read_config_file(path, MAX_FILE, "registry auth file", explicit=explicit)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        raise ConfigError(f"registry auth file {path} is not JSON") from None  # no excerpt: secrets
    return data if isinstance(data, dict) else None


def _keys_for(authority: str) -> set[str]:
    keys = {authority}
    for scheme in ("https://", "http://"):
        for suffix in ("", "/", "/v1/", "/v2/", "/v2"):
            keys.add(f"{scheme}{authority}{suffix}")
    if authority in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        keys.add("https://index.docker.io/v1/")
    return keys


def _from_entry(entry: Any, source: str) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credentials(identity_token=token, source=source)
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
        except (binascii.Error, ValueError):
            raise ConfigError(f"{source}: an auths entry is not base64 user:password") from None
        if sep:
            return Credentials(user, password, source=source)
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(secret, str) and name:
        return Credentials(name, secret, source=source)
    return None


async def run_helper(helper: object, authority: str) -> Credentials | None:
    """``docker-credential-<helper> get`` for ``authority``; None when it has nothing for it.

    Raises:
        ConfigError: the helper is missing, fails, or answers what is not a credential.
        StoreError: the helper did not answer within HELPER_TIMEOUT (it is killed).
    """
    if not isinstance(helper, str) or not _HELPER_NAME.fullmatch(helper):
        raise ConfigError("a credential helper name in the registry auth file is not a name")
    program = shutil.which(f"docker-credential-{helper}")
    if program is None:
        raise ConfigError(f"credential helper docker-credential-{helper} is not on PATH")
    name = f"docker-credential-{helper}"
    try:
        returncode, out = await asyncio.wait_for(_helper_output(program, authority), HELPER_TIMEOUT)
    except asyncio.TimeoutError:
        raise StoreError(
            f"credential helper {name} did not answer in {HELPER_TIMEOUT:g} s"
        ) from None
    if returncode != 0:
        if b"credentials not found" in out.lower():
            return None
        raise ConfigError(f"credential helper {name} failed (exit {returncode})")
    try:
        answer = json.loads(out) if len(out) <= MAX_HELPER_OUTPUT else None
    except ValueError:
        answer = None
    user = answer.get("Username") if isinstance(answer, dict) else None
    secret = answer.get("Secret") if isinstance(answer, dict) else None
    if not (isinstance(user, str) and isinstance(secret, str)):
        raise ConfigError(f"credential helper {name} answered no credential")
    if user == "<token>":
        return Credentials(identity_token=secret, source=name)
    return Credentials(user, secret, source=name)


async def _helper_output(program: str, authority: str) -> tuple[int, bytes]:
    """(exit status, at most MAX_HELPER_OUTPUT + 1 bytes of stdout) of ``program get``; the
    process is killed when it is done with, when it writes past the cap, or when this is
    cancelled (the deadline), so no helper outlives the read. stderr is discarded (docker's
    helpers say "credentials not found" on stdout)."""
    proc = await asyncio.create_subprocess_exec(
        program,
        "get",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its group: a child it forks is killed with it (_kill)
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(authority.encode())
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = bytearray()
        while len(out) <= MAX_HELPER_OUTPUT:
            chunk = await proc.stdout.read(MAX_HELPER_OUTPUT + 1 - len(out))
            if not chunk:
                break
            out += chunk
        if len(out) > MAX_HELPER_OUTPUT:
            raise ConfigError(
                f"credential helper {os.path.basename(program)} answered more than "
                f"{MAX_HELPER_OUTPUT} bytes"
            )
        return await proc.wait(), bytes(out)
    finally:
        if proc.returncode is None:
            _kill(proc)
            await asyncio.shield(_reaped(proc))


def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the helper and its process group (a child it forked, holding its stdout, would
    otherwise keep the pipe open, and the reap waiting on it, past the helper's timeout)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # the group is gone (or not ours): the helper itself still is
        proc.kill()


async def _reaped(proc: asyncio.subprocess.Process) -> None:
    """Wait for a killed helper: what is left in its pipe is read and dropped first (bounded
    now that it is dead), since asyncio's ``wait()`` also waits for the pipe to close, and a
    reader paused on a full buffer never sees it close. A descendant that left the group
    (``setsid``) may still hold the pipe: the wait ends after :data:`REAP_WAIT` regardless."""
    assert proc.stdout is not None

    async def drained() -> None:
        assert proc.stdout is not None
        while await proc.stdout.read(1 << 16):
            pass
        await proc.wait()

    try:
        await asyncio.wait_for(drained(), REAP_WAIT)
    except asyncio.TimeoutError:
        pass


async def find_credentials(authority: str, auth_file: str | None = None) -> Credentials:
    """The credentials for ``authority`` (see the module docstring); anonymous if none.

    Raises:
        ConfigError: an explicit auth file is missing, a file or helper is unusable.
        StoreError: a helper that did not answer in time.
    """
    keys = _keys_for(authority)
    for index, path in enumerate(candidate_files(auth_file)):
        explicit = index == 0 and auth_file is not None
        data = await asyncio.to_thread(_read_json, path, explicit)
        if data is None:
            continue
        helpers = data.get("credHelpers")
        if isinstance(helpers, dict) and authority in helpers:
            return await run_helper(helpers[authority], authority) or ANONYMOUS
        auths = data.get("auths")
        if isinstance(auths, dict):
            for key in sorted(keys & set(auths)):
                found = _from_entry(auths[key], str(path))
                if found is not None:
                    return found
        store = data.get("credsStore")
        if isinstance(store, str) and store:
            found = await run_helper(store, authority)
            if found is not None:
                return found
    return ANONYMOUS
