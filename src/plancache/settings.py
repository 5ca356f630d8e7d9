"""The environment variables users set, in one place for the CLI and the vLLM plugin.

The same deployment usually runs both (a boot script calls ``plancache pull``, the worker
runs the plugin), so a variable means the same thing wherever it is read:

=============================  ==================================================================
``PLANCACHE_URL``              store URL (``s3://bucket/prefix``, ``gs://…``, ``file://…``, any
                               fsspec URL): the plugin's store; the journey scripts' store.
``PLANCACHE_TRUSTED_KEYS``     trusted-keys file or directory of ``.pub`` files.
``PLANCACHE_THRESHOLD``        distinct trusted keys that must sign (plugin; CLI: ``--threshold``).
``PLANCACHE_SIGNING_KEY``      key reference used to sign: a private key file, ``env://VAR``,
                               ``pkcs11:…``, ``awskms://…``, ``gcpkms://…`` (keys/schemes.py).
``PLANCACHE_KEY_PASSPHRASE``   passphrase of an encrypted private key.
``PLANCACHE_TIMEOUT``          total remote budget in seconds (plugin; CLI: ``--timeout``); also
                               the budget of each HSM/KMS call, in the CLI and the plugin.
``PLANCACHE_STORAGE_OPTIONS``  fsspec storage options: a JSON object, or space-separated
                               ``KEY=VALUE`` pairs (VALUE parsed as JSON where it parses), the
                               same as repeated ``--storage-option``, which win over it.
``PLANCACHE_COMPILE_CACHE``    on (``1``, ``true``, ``yes``, ``on``, any case): the plugin verifies
                               vLLM's torch.compile cache before torch reads it, and signs (and
                               pushes) caches vLLM saves; off: ``0``, ``false``, ``no``, ``off`` or
                               unset. Any other value is an error and the guard stays **on**
                               (:func:`compile_cache_switch`).
``PLANCACHE_SIGSTORE_TRUSTED_ROOT``  the Sigstore ``trusted_root.json`` bundles are verified
                               against (CLI: ``--trusted-root``); default: the public-good root
                               shipped with sigstore-python. Read only if an identity is trusted.
``PLANCACHE_SIGSTORE_TRUST_CONFIG``  keyless signing's ``ClientTrustConfig`` JSON (Fulcio, Rekor,
                               their trust root); default: Sigstore's public-good instance.
``SIGSTORE_ID_TOKEN``          the OIDC token keyless signing uses (else ``--identity-token FILE``,
                               else the CI's ambient token: GitHub Actions, GitLab CI).
=============================  ==================================================================
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

URL_ENV = "PLANCACHE_URL"
TRUSTED_KEYS_ENV = "PLANCACHE_TRUSTED_KEYS"
THRESHOLD_ENV = "PLANCACHE_THRESHOLD"
SIGNING_KEY_ENV = "PLANCACHE_SIGNING_KEY"
PASSPHRASE_ENV = "PLANCACHE_KEY_PASSPHRASE"
TIMEOUT_ENV = "PLANCACHE_TIMEOUT"
STORAGE_OPTIONS_ENV = "PLANCACHE_STORAGE_OPTIONS"
SET_REPLICAS_ENV = "PLANCACHE_SET_REPLICAS"
"""Copies of each plan set in the store (``push --set-replicas``): a node reads one, by its host
name."""
SIGN_COLD_ENV = "PLANCACHE_SIGN_COLD"
"""``1``: sign a plan measured by a boot that compiled cold (refused by default, issue 49)."""
COMPILE_CACHE_ENV = "PLANCACHE_COMPILE_CACHE"
SIGSTORE_TRUSTED_ROOT_ENV = "PLANCACHE_SIGSTORE_TRUSTED_ROOT"
SIGSTORE_TRUST_CONFIG_ENV = "PLANCACHE_SIGSTORE_TRUST_CONFIG"
SIGSTORE_ID_TOKEN_ENV = "SIGSTORE_ID_TOKEN"
SIGSTORE_ID_TOKEN_FILE_ENV = "PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE"
"""Where ``--identity-token FILE`` puts its path for the signer (the token stays in the file)."""

DEFAULT_TIMEOUT = 3.0
"""Overall budget in seconds of a remote operation when the caller names none: a boot-time
lookup (the plugin's ``PLANCACHE_TIMEOUT`` and ``plancache pull --fingerprint``)."""

BULK_TIMEOUT = 120.0
"""Budget of each store operation for whole-store commands (verify, ls, push, prune, full pull)."""

BOOT_TIMEOUT = 10.0
"""End-to-end budget of a whole-store pull on a boot's critical path (``plancache pull --boot``
without ``--fingerprint``, the spot-boot journey without fingerprints): a black-holed store
delays a boot by this much at most, not by BULK_TIMEOUT."""

HEADERS_TIMEOUT = 10.0
"""Budget, at least (the store's own when larger), of fetching a pulled cache's precompiled
headers (26 MB, then 0.8 s to inflate and hash, against 11-60 s of gcc to build them): its own,
so a slow header never costs a node its cache; past it torch builds the header."""


SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off")


def compile_cache_switch(value: str | None) -> tuple[bool, str]:
    """``PLANCACHE_COMPILE_CACHE`` as the plugin and ``doctor`` read it: (on, problem).

    Why strict, and why an unknown value means *on*: the guard is what stands between a
    tampered cache and the worker, and an operator who wrote ``true`` or ``enabled`` meant it
    on; reading a typo as off would silently run whatever the cache holds. Unset is off (no
    problem); surrounding whitespace is ignored; ``problem`` names the variable and is empty
    when the value is one of :data:`SWITCH_ON` / :data:`SWITCH_OFF` (any case)."""
    if value is None:
        return False, ""
    word = value.strip().lower()
    if word in SWITCH_ON or word in SWITCH_OFF:
        return word in SWITCH_ON, ""
    shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
    return True, (
        f"{COMPILE_CACHE_ENV}={shown} is not one of {'/'.join(SWITCH_ON + SWITCH_OFF)}: "
        "the compile-cache guard stays on"
    )


def parse_key_value(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON where it parses, else kept as a string.

    Raises:
        ValueError: not ``KEY=VALUE`` (the item is not shown: it may hold a secret), or a
            VALUE nested too deeply to parse.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key:  # the item itself is not shown: it may be a credential
        raise ValueError(
            f"an item of {len(item)} characters is not KEY=VALUE (not shown: it may hold a secret)"
        )
    try:
        return key, json.loads(raw)
    except RecursionError:
        raise ValueError(f"{key[:40]!r}: the value nests too deeply") from None
    except ValueError:
        return key, raw


def parse_storage_options(text: str) -> dict[str, Any]:
    """``PLANCACHE_STORAGE_OPTIONS``: a JSON object (needed for nested options such as
    ``config_kwargs``) or space-separated ``KEY=VALUE`` pairs.

    Raises:
        ValueError: text starting with ``{`` that is not a JSON object (or nests too deeply),
            or a pair that is not ``KEY=VALUE`` (:func:`parse_key_value`).
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except RecursionError:
            raise ValueError("not a JSON object (nests too deeply)") from None
        except ValueError as exc:
            raise ValueError(f"not a JSON object ({exc})") from None
        if not isinstance(parsed, dict):
            raise ValueError("not a JSON object")
        return parsed
    return dict(parse_key_value(item) for item in text.split())


def unknown_option(key: object, *, protocol: str, backend: str, accepted: set[str]) -> str:
    """The message for a storage option ``backend`` does not take, with the closest name it
    does (``-`` read as ``_``): one wording for every store, whether the option is caught before
    the open (:func:`plancache.storage.checks.check_options`) or by the opener itself. Named:
    ``protocol`` and ``backend`` are both strings, and swapped they would still read."""
    import difflib

    guess = difflib.get_close_matches(str(key).replace("-", "_"), sorted(accepted), n=1)
    hint = f"; did you mean {guess[0]!r}?" if guess else ""
    return f"unknown storage option {key!r} for {protocol}:// ({backend}){hint}"


_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
MAX_DURATION = timedelta(days=100 * 366)
"""Longer than any signature lifetime or age that means something; beyond it dates overflow."""


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` -> timedelta, up to 100 years: the one rule
    for a duration, in a flag (``--expires``, ``--older-than``) or in the environment
    (``PLANCACHE_COMPILE_CACHE_EXPIRES``), so the plugin reads it without the CLI.

    Raises:
        ValueError: not a positive whole number and a unit, or longer than 100 years.
    """
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 30d, 12h, 90m, 2w")
    try:
        value = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    except OverflowError:
        value = MAX_DURATION + MAX_DURATION
    if value > MAX_DURATION:
        raise ValueError(f"{text!r} is longer than 100 years")
    return value
