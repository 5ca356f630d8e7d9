"""What a build node must not ship: its secrets and private paths, found in a file's bytes.

torch writes a reproduction snippet into what it compiles (``CompiledFxGraph.runnable_graph_str``,
pickled into inductor's cache entries and vLLM's AOT artifact): ``generate_env_vars_string`` in
``torch/_dynamo/debug_utils.py`` copies *every* environment variable whose name contains
``TORCH``, ``DYNAMO``, ``INDUCTOR`` or ``TRITON`` as ``os.environ['NAME'] = 'value'``, and
``generate_config_string`` each non-default config value as ``torch._inductor.config.x = 'value'``.
So a Kubernetes Service named ``triton-…`` (``TRITON_…_PORT='tcp://10.…'``), a remote cache URL
with its password, an API token, a profiler directory under a user's home all end up in bytes a
store would hold. The compiled files also carry the absolute paths they were built under.

:func:`scan` finds, in one file's bytes:

- every entry of torch's snapshots whose value looks private (:func:`private_kind`): judged on its
  own, so a snapshot is caught even where the node's environment is not the build's (``push``
  run by another job);
- every value of this node's environment that looks private (:class:`NodeSecrets`), anywhere;
- this node's home directory, a user's home path or ``torchinductor_<user>``, and its host name,
  when they are distinctive (not ``/root``, not ``localhost``), *outside* the allowed paths: the
  cache root is in every ``.so`` and pickle torch writes (it compiled there), so it ships by design
  and is masked first; SECURITY.md says to give a pushing node a neutral root.

Refusing is the only remedy: a pickle or shared object edited in place is not provably what torch
would load, so the caller does not push (reason ``private-data``), naming the variable (or
``$HOME``, ``user name``, ``host name``) and the file, never the value. Pure: bytes in, findings
out; what the node's environment is, is the caller's to read.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..display import redact

MIN_NEEDLE = 6
"""Shorter environment values are not searched for in the bytes (``1``, ``cpu``, ``true``
appear in any binary); torch's snapshot entries are judged whatever their length."""
MAX_VALUE = 4096
MAX_FINDINGS = 20
"""Findings kept per file: the refusal names the first ones; one is enough to refuse."""

_ENV_ENTRY = re.compile(
    rb"""os\.environ\[(['"])([A-Za-z_][A-Za-z0-9_]{0,200})\1\]\s*=\s*(['"])((?:(?!\3).){0,%d})"""
    % MAX_VALUE,
    re.DOTALL,
)
"""``os.environ['NAME'] = 'value'``: torch's ``generate_env_vars_string`` (every variable named
with TORCH, DYNAMO, INDUCTOR or TRITON; a ``'`` in a value becomes ``"``; newlines kept). A
value is judged up to its closing quote or :data:`MAX_VALUE` characters, whichever comes first:
a longer one by its start, never skipped."""
_CONFIG_ENTRY = re.compile(
    rb"""(torch\.[A-Za-z0-9_.]{0,200}config\.[A-Za-z0-9_.]{1,200})\s*=\s*(['"])((?:(?!\2).){0,%d})"""
    % MAX_VALUE,
    re.DOTALL,
)
"""``torch._inductor.config.x = 'value'``: ``generate_config_string``'s string-valued settings."""
_USERINFO = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://([^/?#@\s]+)@")
_SECRET_NAME = re.compile(
    r"(?i)(^|_)(KEY|PASS|PWD|PIN|SAS|DSN|COOKIE|SIG)(_|$)|(^|_)CERT$|TOKEN(?!S|IZER)|AUTH(?!OR)|"
    r"SECRET|PASSW|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|SESSION|"
    r"CONNECTION_?STRING|BEARER"
)
"""A name that says it holds a credential, the word anywhere (``TRITON_APITOKEN``,
``TORCHINDUCTOR_REDIS_AUTHTOKEN``, ``TRITON_AUTH_HEADER``) or a short one as a whole part
(``DB_PASS``, ``X_KEY_ID``); not ``…_TOKENS`` (a count), ``TOKENIZER…`` or ``AUTHOR``."""
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})
"""The shell's working directories: named like a password (``…_PWD``), holding a path (judged as
one)."""
_FLAG = re.compile(r"(?i)[0-9]{1,4}|true|false|yes|no|on|off|none|")
"""A value that is a switch or a small number, not a secret, whatever its variable is named."""
_TOKEN_PREFIX = re.compile(
    r"\b(?:eyJ[A-Za-z0-9_-]{8,}\.|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|github_pat_|"
    r"glpat-|xox[abprs]-|sk-[A-Za-z0-9_-]{8,}|(?:AKIA|ASIA)[A-Z0-9]{12,}|AIza[A-Za-z0-9_-]{20,}|"
    r"(?i:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,})"
)
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9+/=_\-.~]{20,}")
_IPV4 = re.compile(r"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?![0-9.])")
_IPV6 = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![0-9A-Fa-f:])")
"""An IPv6 literal (``tcp://[fd00:10:96::a1b2]:8000``, what Kubernetes injects on an IPv6
cluster); judged by :mod:`ipaddress`."""
_INTERNAL_HOST = re.compile(
    r"(?i)[a-z0-9-]\.(?:internal|local|localdomain|lan|corp|intranet|svc|cluster\.local|"
    r"home\.arpa)(?![a-z0-9.-])"
)
_USER_HOME = re.compile(r"(?<![A-Za-z0-9_.-])/(?:home|Users)/[A-Za-z0-9_.][A-Za-z0-9_.-]*")
_PATH_END = r"(?![A-Za-z0-9_.~-])"
"""Where a path ends: not inside a longer name."""
_GENERIC_HOMES = frozenset({"", "/", "/root", "/home", "/tmp", "/var/empty", "/nonexistent"})
_GENERIC_USERS = frozenset({"", "root", "nobody"})
_GENERIC_HOSTS = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost"}
    | {"debian", "ubuntu", "fedora", "centos", "alpine", "rocky", "almalinux", "archlinux"}
)
"""Names no node is told by: the loopback's, and a distribution's installer default, which its
compiler also writes into every object it builds (``GCC: (Debian 12.2.0-14) 12.2.0`` in each
``.so``'s ``.comment``): searched for, it would refuse every clean cache built there."""


@dataclass(frozen=True)
class Finding:
    """One private thing in one file: what it is named (never its value) and why it is private."""

    path: str
    what: str
    """The variable's or setting's name, or ``$HOME``, ``user name``, ``host name``."""
    kind: str

    def line(self) -> str:
        return f"{self.what} ({self.kind}) in {self.path}"


@dataclass(frozen=True)
class NodeSecrets:
    """What this node must not ship: private values of its environment, and its names."""

    needles: tuple[tuple[str, str, bytes], ...] = ()
    """(what, kind, bytes) searched for anywhere (the home, host and user forms included)."""
    allowed: tuple[re.Pattern[bytes], ...] = ()
    """Paths that ship by design (the cache root), masked before anything is searched: each as a
    whole path (``/var/cache/vllm``, not the start of ``/var/cache/vllm-alice``)."""
    home: str = ""
    user: str = ""
    host: str = ""
    patterns: tuple[tuple[str, str, re.Pattern[bytes]], ...] = field(default=(), repr=False)
    """(what, kind, pattern) for the home, user and host names (bounded on both sides)."""


def _distinctive_home(home: str) -> str:
    home = home.rstrip("/")
    return "" if home in _GENERIC_HOMES or not home.startswith("/") else home


def _distinctive_user(user: str) -> str:
    return "" if user in _GENERIC_USERS or len(user) < 2 or "/" in user else user


def _distinctive_host(host: str) -> str:
    host = host.strip().lower()
    return "" if host in _GENERIC_HOSTS or len(host) < 6 else host


def private_kind(name: str, value: str, *, home: str = "", user: str = "", host: str = "") -> str:
    """Why ``value`` (of variable or setting ``name``) must not ship, or "" when it may.

    A URL with credentials, a secret-named variable that holds more than a switch, something
    shaped like a token, an internal address (a private, link-local or shared IPv4, a host under
    ``.internal``/``.local``/``.svc``…), a path under this node's home or a user's home, or this
    node's host name. Over-refusing costs a push (the line says what to unset); under-refusing
    ships a secret."""
    if not value:
        return ""
    if _USERINFO.search(value):
        return "a URL with credentials"
    if redact(value) != value:  # ?token=, &sig=, Authorization: Bearer, a JWT, pin-value=
        return "a credential"
    if (
        _SECRET_NAME.search(name)
        and name not in _NOT_SECRET_NAMES
        and not _FLAG.fullmatch(value.strip())
    ):
        return "a secret-named variable"
    if _TOKEN_PREFIX.search(value) or (
        _TOKEN_SHAPE.fullmatch(value)
        and re.search(r"[a-z]", value)
        and re.search(r"[A-Z]", value)
        and re.search(r"[0-9]", value)
    ):
        return "a token"
    if _internal_address(value):
        return "an internal address"
    home, user, host = _distinctive_home(home), _distinctive_user(user), _distinctive_host(host)
    if home and (value == home or home + "/" in value):
        return "a path under $HOME"
    if user and any(p + user in value for p in ("/home/", "/Users/", "torchinductor_")):
        return "a user's name in a path"
    if _USER_HOME.search(value):  # another user's, or this one's seen from another process
        return "a path under a user's home"
    if host and re.search(rf"(?i)(?<![a-z0-9_-]){re.escape(host)}(?![a-z0-9_-])", value):
        return "the host name"
    return ""


def _internal_address(value: str) -> bool:
    if _INTERNAL_HOST.search(value):
        return True
    for literal in _IPV6.findall(value) if value.count(":") >= 2 else ():
        try:
            address6 = ipaddress.IPv6Address(literal)
        except ValueError:
            continue
        if (address6.is_private or address6.is_link_local or address6.is_site_local) and not (
            address6.is_loopback or address6.is_unspecified
        ):
            return True
    for literal in _IPV4.findall(value):
        try:
            address = ipaddress.IPv4Address(literal)
        except ValueError:
            continue
        if (address.is_private or address in _SHARED) and not (
            address.is_loopback or address.is_unspecified
        ):
            return True
    return False


_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT: pod networks use it


def node_secrets(
    environ: Mapping[str, str],
    *,
    home: str = "",
    user: str = "",
    host: str = "",
    allowed: Iterable[str] = (),
) -> NodeSecrets:
    """This node's private values (every environment variable :func:`private_kind` flags, at least
    :data:`MIN_NEEDLE` long, as it is and as torch's snapshot writes it) and names."""
    own = _distinctive_home(home)
    masked = sorted(
        {
            p.rstrip("/")
            for p in allowed
            if p.rstrip("/")
            and not (own and (own + "/").startswith(p.rstrip("/") + "/"))
            and not private_kind("", p, home=home, user=user, host=host)
        },
        key=len,
        reverse=True,
    )  # never the home itself or above it (PLANCACHE_PRIVATE_DIR=$HOME would hide all of it),
    # and never a root that itself names the home, a user or the host (vLLM's default
    # ~/.cache/vllm under /home/alice): such a root is what issue 46 found in every .so, so it
    # is searched like any other path and the push says to build under a neutral root
    needles: list[tuple[str, str, bytes]] = []
    for name, value in sorted(environ.items()):
        shown = value
        for path in masked:
            shown = re.sub(re.escape(path) + _PATH_END, "\0", shown)
        kind = private_kind(name, shown, home=home, user=user, host=host)
        if not kind:
            continue
        forms = {value, value.replace("'", '"')}
        found = _USERINFO.search(value)
        if found:
            forms.add(found.group(1))
            forms.add(found.group(1).rpartition(":")[2])
        for form in sorted(forms):
            if len(form) >= MIN_NEEDLE and form != _distinctive_home(home):
                needles.append((name, kind, form.encode("utf-8", "surrogateescape")))
    patterns: list[tuple[str, str, re.Pattern[bytes]]] = []
    tail = rb"(?![A-Za-z0-9_.-])"
    if _distinctive_home(home):
        encoded = re.escape(_distinctive_home(home).encode("utf-8", "surrogateescape"))
        patterns.append(("$HOME", "the build node's home directory", re.compile(encoded + tail)))
    if _distinctive_user(user):
        login = re.escape(_distinctive_user(user).encode("utf-8", "surrogateescape"))
        patterns.append(
            (
                "user name",
                "a user's name in a path",
                re.compile(rb"(?:/home/|/Users/|torchinductor_)" + login + tail),
            )
        )
    if _distinctive_host(host):
        hostname = re.escape(_distinctive_host(host).encode("ascii", "replace"))
        patterns.append(
            (
                "host name",
                "the build node's host name",
                re.compile(rb"(?i)(?<![A-Za-z0-9_-])" + hostname + rb"(?![A-Za-z0-9_-])"),
            )
        )
    return NodeSecrets(
        needles=tuple(needles),
        allowed=tuple(
            re.compile(re.escape(p.encode("utf-8", "surrogateescape")) + _PATH_END.encode())
            for p in masked
        ),
        home=home,
        user=user,
        host=host,
        patterns=tuple(patterns),
    )


def scan(path: str, data: bytes, secrets: NodeSecrets) -> list[Finding]:
    """The private things in ``data`` (the file ``path`` of an archive), at most
    :data:`MAX_FINDINGS`, each named once: torch's snapshot entries first, then this node's
    values and names. The allowed paths are masked first (longest first)."""
    for allowed in secrets.allowed:
        data = allowed.sub(b"\0", data)
    found: dict[tuple[str, str], Finding] = {}

    def note(what: str, kind: str) -> None:
        if len(found) < MAX_FINDINGS:
            found.setdefault((what, kind), Finding(path, what, kind))

    names = {"home": secrets.home, "user": secrets.user, "host": secrets.host}
    if b"environ" in data:
        for match in _ENV_ENTRY.finditer(data):
            name = match.group(2).decode("ascii")
            kind = private_kind(name, match.group(4).decode("utf-8", "replace"), **names)
            if kind:
                note(name, kind)
    if b"config." in data:
        for match in _CONFIG_ENTRY.finditer(data):
            name = match.group(1).decode("ascii")
            kind = private_kind(name, match.group(3).decode("utf-8", "replace"), **names)
            if kind:
                note(name, kind)
    for what, kind, needle in secrets.needles:
        if needle in data:
            note(what, kind)
    for what, kind, pattern in secrets.patterns:
        if pattern.search(data):
            note(what, kind)
    return list(found.values())


NODE_NAMES = frozenset({"$HOME", "user name", "host name"})
"""What a finding names when it is the node's own name, not a variable: unsetting fixes
nothing (a host name in every ``.so``, a virtualenv under the home)."""


def refusal(findings: list[Finding], limit: int = 8) -> str:
    """One line naming what was found, each name once, then the files (never a value): the
    ``private-data`` detail. Names come first, so a line cut for a log still names them."""
    kinds = dict.fromkeys((f.what, f.kind) for f in findings)
    files = list(dict.fromkeys(f.path for f in findings))
    names = ", ".join(f"{what} ({kind})" for what, kind in list(kinds)[:limit])
    names += f" and {len(kinds) - limit} more" if len(kinds) > limit else ""
    where = files[0] + (f" and {len(files) - 1} more file(s)" if len(files) > 1 else "")
    if any(what in NODE_NAMES for what, _ in kinds):  # no variable to unset: where it was built
        return (
            f"not pushed: {names} in {where} (unset what is a variable; for a home, user or "
            "host name, build outside the home under a neutral root and host name, and compile "
            "again)"
        )
    return f"not pushed: {names} in {where} (unset it on the build node and compile again)"
