"""``pkcs11:`` keys: an Ed25519 key inside an HSM or a token, signing with ``CKM_EDDSA``
through PyKCS11 (extra ``[pkcs11]``); the reference's syntax is :mod:`.pkcs11_uri`'s.

Exactly one token and one private key must match the reference. The private key never leaves
the token: plancache reads the public key object beside it (same CKA_ID, else same label) to
compute the key id and check each signature, and asks the token for ``C_Sign``. PyKCS11 was
chosen over python-pkcs11: no Python dependencies of its own, and maintained for two decades by
the PC/SC-lite maintainer. Every token call runs within the key budget
(:func:`~.remote_signer.within`), one caller at a time.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..storage.local.files import read_capped
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError
from .pkcs11_uri import Pkcs11Ref, parse_pkcs11_uri
from .remote_signer import RemoteSigner, missing_extra, one_line, within

_ED25519_PARAMS = (b"\x06\x03\x2b\x65\x70", b"\x13\x0cedwards25519")
"""CKA_EC_PARAMS of Ed25519: the OID 1.3.101.112, or the printable string SoftHSM writes."""
MAX_PIN_FILE_BYTES = 4096


class _TokenInfo(Protocol):
    """What plancache reads of PyKCS11's ``CK_TOKEN_INFO`` (PyKCS11 ships no types); the
    selectors' fields (``serialNumber``, ...) are read by name."""

    flags: int
    label: str


class _Session(Protocol):
    def login(self, pin: str) -> None: ...

    def findObjects(self, template: list[tuple[int, Any]]) -> list[object]: ...

    def getAttributeValue(self, obj: object, attr: list[int]) -> list[Any]: ...  # per attribute

    def sign(self, key: object, data: bytes, mecha: object) -> list[int]: ...

    def closeSession(self) -> None: ...


class _Library(Protocol):
    def load(self, module: str) -> None: ...

    def getSlotList(self, tokenPresent: bool) -> list[int]: ...

    def getTokenInfo(self, slot: int) -> _TokenInfo: ...

    def openSession(self, slot: int, flags: int) -> _Session: ...


_libs: dict[str, _Library] = {}
_lock = threading.Lock()
"""One loaded library per module path (C_Initialize once per process), and one caller at a
time: PKCS#11 login state is per application and token, not per session."""


def _read_pin(source: str) -> str:
    """``pin-source=file:/path`` (or a bare path): the PIN file, refused if others can read it.

    Opened non-blocking and read capped, as every file plancache reads: a FIFO or a device
    named as the PIN file is refused at once instead of blocking the open (outside any budget)
    or streaming forever. Runs on the budget's thread (:func:`pkcs11_signer`).
    """
    path = Path(source.removeprefix("file://").removeprefix("file:")).expanduser()
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read PIN file {path}: {exc.strerror}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ConfigError(f"PIN file {path} is readable by others; run: chmod 600 {path}")
    try:  # links followed: secrets are often mounted as links
        data = read_capped(path, MAX_PIN_FILE_BYTES, follow_symlinks=True)
    except PlanCacheError as exc:
        detail = exc.detail
        raise ConfigError(
            f"PIN file {detail}"
            if detail.startswith(str(path))
            else detail.replace(f"read {path}", f"read PIN file {path}")
        ) from None
    if data is None:
        raise ConfigError(f"cannot read PIN file {path}: No such file or directory")
    return data.decode("utf-8", "replace").rstrip("\r\n")


def _loadable(module: str) -> None:
    """ConfigError unless ``module`` loads and exports ``C_GetFunctionList``, asked through
    ctypes before PyKCS11 loads it.

    PyKCS11's loader prints ``dlopen``'s and ``dlsym``'s complaints with C ``printf``, straight
    to stdout, ahead of a ``--json`` report that must be the only thing there. The same
    ``dlopen`` (``RTLD_NOW``, as PyKCS11 asks) through ctypes fails with the message as an
    exception instead, so PyKCS11 is only handed a module it will load without a word. (No
    file descriptor games: a load that hangs past the budget must not take stdout with it.)
    """
    import ctypes

    try:
        handle = ctypes.CDLL(module)
    except OSError as exc:
        raise ConfigError(
            f"cannot load the PKCS#11 module {safe_text(module, 120)}: {one_line(exc)}"
        ) from None
    if not hasattr(handle, "C_GetFunctionList"):
        raise ConfigError(
            f"{safe_text(module, 120)} is not a PKCS#11 module (it exports no C_GetFunctionList)"
        )


def _library(module: str) -> _Library:
    try:
        import PyKCS11
    except ImportError:
        raise missing_extra("pkcs11:", "PyKCS11", "pkcs11") from None
    lib = _libs.get(module)
    if lib is None:
        _loadable(module)
        loaded: _Library = PyKCS11.PyKCS11Lib()
        try:
            loaded.load(module)
        except PyKCS11.PyKCS11Error as exc:
            raise ConfigError(
                f"cannot load the PKCS#11 module {safe_text(module, 120)}: {one_line(exc)}"
            ) from None
        _libs[module] = lib = loaded
    return lib


def _slot(lib: _Library, ref: Pkcs11Ref) -> int:
    fields = {
        "token": "label",
        "serial": "serialNumber",
        "manufacturer": "manufacturerID",
        "model": "model",
    }
    matches, labels = [], []
    import PyKCS11

    for slot in lib.getSlotList(tokenPresent=True):
        info = lib.getTokenInfo(slot)
        if not info.flags & PyKCS11.CKF_TOKEN_INITIALIZED:
            continue  # an empty slot (SoftHSM always offers one) holds no key
        labels.append(info.label.strip())
        wanted = {
            attr: ref.path[attr].decode("utf-8", "replace") for attr in fields if attr in ref.path
        }
        if all(getattr(info, fields[attr]).strip() == value for attr, value in wanted.items()) and (
            "slot-id" not in ref.path or ref.path["slot-id"] == str(slot).encode()
        ):
            matches.append(slot)
    if len(matches) != 1:
        present = ", ".join(repr(safe_text(label, 32)) for label in labels) or "none"
        count = "no token matches" if not matches else f"{len(matches)} tokens match (add serial=)"
        raise ConfigError(f"{ref.source}: {count}; tokens present: {present}")
    return matches[0]


@contextmanager
def _session(lib: _Library, slot: int, ref: Pkcs11Ref) -> Iterator[_Session]:
    import PyKCS11

    session = lib.openSession(slot, PyKCS11.CKF_SERIAL_SESSION)
    try:
        if ref.pin is not None:
            try:
                session.login(ref.pin)
            except PyKCS11.PyKCS11Error as exc:
                if exc.value != PyKCS11.CKR_USER_ALREADY_LOGGED_IN:
                    raise
        yield session
    finally:
        session.closeSession()


def _template(ref: Pkcs11Ref, cls: int) -> list[tuple[int, Any]]:
    import PyKCS11

    template: list[tuple[int, Any]] = [(PyKCS11.CKA_CLASS, cls)]
    if "object" in ref.path:
        template.append((PyKCS11.CKA_LABEL, ref.path["object"].decode("utf-8", "replace")))
    if "id" in ref.path:
        template.append((PyKCS11.CKA_ID, tuple(ref.path["id"])))
    return template


def _one(session: _Session, ref: Pkcs11Ref, cls: int, what: str) -> object:
    found = session.findObjects(_template(ref, cls))
    if len(found) != 1:
        hint = (
            "log in: add pin-value= or pin-source="
            if ref.pin is None and what == "private key"
            else "name it with object= or id="
        )
        raise ConfigError(f"{ref.source}: {len(found)} {what} objects match ({hint})")
    return found[0]


def _public_key(session: _Session, ref: Pkcs11Ref) -> Ed25519PublicKey:
    """The public key object beside the private key: Ed25519 params and a 32-byte point
    (bare, or DER-wrapped as OCTET STRING, which SoftHSM writes)."""
    import PyKCS11

    private = _one(session, ref, PyKCS11.CKO_PRIVATE_KEY, "private key")
    (key_type,) = session.getAttributeValue(private, [PyKCS11.CKA_KEY_TYPE])
    if key_type != PyKCS11.CKK_EC_EDWARDS:
        raise ConfigError(f"{ref.source}: the key is not an Ed25519 (CKK_EC_EDWARDS) key")
    public = _one(session, ref, PyKCS11.CKO_PUBLIC_KEY, "public key")
    point, params = (
        bytes(v)
        for v in session.getAttributeValue(public, [PyKCS11.CKA_EC_POINT, PyKCS11.CKA_EC_PARAMS])
    )
    if params not in _ED25519_PARAMS:
        raise ConfigError(f"{ref.source}: the key's curve is not edwards25519")
    if len(point) == 34 and point[:2] == b"\x04\x20":
        point = point[2:]
    if len(point) != 32:
        raise ConfigError(f"{ref.source}: the public key object holds no 32-byte Ed25519 point")
    return Ed25519PublicKey.from_public_bytes(point)


def _sign(lib: _Library, slot: int, ref: Pkcs11Ref, data: bytes) -> bytes:
    import PyKCS11

    with _lock, _session(lib, slot, ref) as session:
        private = _one(session, ref, PyKCS11.CKO_PRIVATE_KEY, "private key")
        return bytes(session.sign(private, data, PyKCS11.Mechanism(PyKCS11.CKM_EDDSA, None)))


def pkcs11_signer(ref_text: str, budget: float) -> RemoteSigner:
    """Load the module, find the token and the key, read the public key: all within ``budget``.

    Raises:
        ConfigError: a malformed reference, an unreadable PIN file, a module that does not load,
            not exactly one token or key matching, a key that is not Ed25519, a refusal of the
            token, PyKCS11 not installed (reason ``config-error``).
        StoreTimeout: the token did not answer within ``budget`` (reason ``timeout``).
    """
    parsed = parse_pkcs11_uri(ref_text)

    def load() -> tuple[Pkcs11Ref, _Library, int, Ed25519PublicKey]:
        ref = (
            parsed
            if parsed.pin_source is None
            else replace(parsed, pin=_read_pin(parsed.pin_source))
        )
        with _lock:
            lib = _library(ref.module)  # first: it names the extra when PyKCS11 is missing
            import PyKCS11

            try:
                slot = _slot(lib, ref)
                with _session(lib, slot, ref) as session:
                    return ref, lib, slot, _public_key(session, ref)
            except PyKCS11.PyKCS11Error as exc:
                raise ConfigError(f"{ref.source}: {one_line(exc)}") from None

    ref, lib, slot, public = within(budget, f"opening {parsed.source}", load)

    def raw_sign(data: bytes) -> bytes:
        import PyKCS11

        try:
            return _sign(lib, slot, ref, data)
        except PyKCS11.PyKCS11Error as exc:
            raise ConfigError(f"{ref.source}: signing failed: {one_line(exc)}") from None

    return RemoteSigner(ref.source, public, raw_sign, budget)
