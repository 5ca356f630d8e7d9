"""``pkcs11:`` key references (RFC 7512): which token and key, which module, which PIN::

    pkcs11:token=ci;object=signer?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=1234
    pkcs11:token=ci;id=%01?module-path=…&pin-source=file:/run/secrets/hsm-pin

Path attributes select the token (``token``, ``serial``, ``manufacturer``, ``model``,
``slot-id``) and the key (``object`` = CKA_LABEL, ``id`` = CKA_ID, ``type=private``); query
attributes name the module and the PIN. An attribute plancache does not know is refused: a
selector ignored could pick another key. Split from :mod:`.pkcs11` (the token itself) by what
these share: the reference's text and how it is shown (never its PIN); no IO, no PyKCS11.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from ..trust.display import safe_text
from ..trust.errors import ConfigError

SCHEME = "pkcs11:"
_PATH_ATTRS = ("token", "object", "id", "serial", "manufacturer", "model", "slot-id", "type")
_QUERY_ATTRS = ("module-path", "pin-value", "pin-source")


@dataclass(frozen=True)
class Pkcs11Ref:
    path: dict[str, bytes]
    module: str
    pin: str | None
    pin_source: str | None = None
    """``pin-source``, read by :mod:`.pkcs11` inside the budget, never at parse time."""

    @property
    def source(self) -> str:
        """The reference without its query: never show a PIN."""
        shown = ";".join(
            f"{k}={safe_text(v.decode('utf-8', 'replace'), 40)}"
            for k, v in self.path.items()
            if k != "id"
        )
        if "id" in self.path:
            shown += (";" if shown else "") + "id=" + "".join(f"%{b:02x}" for b in self.path["id"])
        return f"pkcs11:{shown}"


def _attributes(text: str, *, sep: str, allowed: tuple[str, ...], where: str) -> dict[str, bytes]:
    """``name=value`` pairs split at ``sep``, percent-decoded (named: ``sep`` and ``where`` are
    strings beside ``text``)."""
    found: dict[str, bytes] = {}
    for part in filter(None, text.split(sep)):
        name, eq, value = part.partition("=")
        if not eq or name not in allowed or name in found:
            raise ConfigError(
                f"pkcs11 URI: unknown or repeated {where} attribute '{safe_text(name, 30)}' "
                f"(use {', '.join(allowed)})"
            )
        found[name] = unquote_to_bytes(value)
    return found


def parse_pkcs11_uri(ref: str) -> Pkcs11Ref:
    """An RFC 7512 reference, checked for plancache's attributes (module docstring).

    Raises:
        ConfigError: not ``pkcs11:``, an unknown or repeated attribute, ``type`` other than
            private, no ``module-path``, both ``pin-value`` and ``pin-source``
            (reason ``config-error``).
    """
    if not ref.startswith(SCHEME):
        raise ConfigError("not a pkcs11: URI")
    path_text, _, query_text = ref[len(SCHEME) :].partition("?")
    path = _attributes(path_text, sep=";", allowed=_PATH_ATTRS, where="path")
    query = {
        k: v.decode("utf-8", "replace")
        for k, v in _attributes(query_text, sep="&", allowed=_QUERY_ATTRS, where="query").items()
    }
    if path.get("type", b"private") != b"private":
        raise ConfigError("pkcs11 URI: type must be 'private' (the signing key)")
    path.pop("type", None)
    if "module-path" not in query:
        raise ConfigError("pkcs11 URI: add ?module-path=/path/to/the/pkcs11-module.so")
    if "pin-value" in query and "pin-source" in query:
        raise ConfigError("pkcs11 URI: give pin-value or pin-source, not both")
    return Pkcs11Ref(path, query["module-path"], query.get("pin-value"), query.get("pin-source"))
