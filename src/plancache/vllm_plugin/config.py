"""The plugin's knobs, read from the environment once per worker boot.

=============================  ==================================================================
``VLLM_ENABLE_STARTUP_PLAN``   vLLM's own switch, parsed as vLLM parses it (an integer, non-zero
                               = on). Off: the plugin patches nothing and vLLM is untouched.
``PLANCACHE_TRUSTED_KEYS``     trusted-keys file or directory of ``.pub`` files. Set: every plan,
                               local or remote, must verify. Unset: local plans are admitted
                               unsigned (strict parse + gate) and the store is never read.
``PLANCACHE_THRESHOLD``        distinct trusted keys that must sign (default 1).
``PLANCACHE_URL``              store URL (``s3://bucket/prefix``, ``gs://…``, ``file://…``, any
                               fsspec URL). Read only with trusted keys; written only with a
                               signing key.
``PLANCACHE_STORAGE_OPTIONS``  fsspec storage options: a JSON object, or space-separated
                               ``KEY=VALUE`` pairs (VALUE parsed as JSON where it parses) as the
                               CLI's ``--storage-option`` and scripts/*.sh take them. Explicit
                               options win over plancache's defaults; fsspec's own configuration
                               (``FSSPEC_S3_*``, ``AWS_ENDPOINT_URL``, credential chains) applies.
``PLANCACHE_SIGNING_KEY``      private key reference (a file path): freshly profiled plans are
                               signed, and pushed when ``PLANCACHE_URL`` is set.
``PLANCACHE_KEY_PASSPHRASE``   passphrase of an encrypted signing key.
``PLANCACHE_TIMEOUT``          total remote budget per boot in seconds (default 3).
``PLANCACHE_SET_REPLICAS``     copies of each plan set the store holds (``push --set-replicas``);
                               a node reads the copy its host name hashes to (default 1).
``PLANCACHE_SIGN_COLD``        ``1``: sign a plan even when the boot that measured it compiled
                               cold (by default refused: vLLM records less KV cache then).
=============================  ==================================================================

Parsing here is pure (a mapping in, a :class:`PluginConfig` out); loading the key files it
names happens in :mod:`plancache.vllm_plugin.boot`, where a failure becomes one ERROR line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..settings import (
    DEFAULT_TIMEOUT,
    SET_REPLICAS_ENV,
    SIGN_COLD_ENV,
    SIGNING_KEY_ENV,
    STORAGE_OPTIONS_ENV,
    THRESHOLD_ENV,
    TIMEOUT_ENV,
    TRUSTED_KEYS_ENV,
    URL_ENV,
    parse_storage_options,
)

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class PluginConfig:
    url: str | None = None
    trusted_keys: str | None = None
    threshold: int = 1
    signing_key: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    set_replicas: int = 1
    sign_cold: bool = False
    """Sign plans measured by a cold-compile boot (``PLANCACHE_SIGN_COLD=1``): the override."""
    errors: tuple[str, ...] = ()
    """Configuration problems found while parsing; each becomes one ERROR line."""


def _nonempty(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _number(raw: str, kind: Callable[[str], N], within: Callable[[N], bool]) -> N | None:
    """``raw`` read as ``kind`` (``int``, ``float``) when it reads and is ``within`` range, else
    None."""
    try:
        value = kind(raw)
    except ValueError:
        return None
    return value if within(value) else None


def parse_config(env: Mapping[str, str] = os.environ) -> PluginConfig:
    """Read the ``PLANCACHE_*`` variables. Never raises: bad values are collected in ``errors``
    and the knob falls back to its safe setting (no store, default budget)."""
    errors: list[str] = []
    url = _nonempty(env, URL_ENV)
    if url is not None and "://" not in url:
        errors.append(
            f"{URL_ENV}={url!r} is not a store URL (expected s3://bucket/prefix, gs://…, "
            "file://…); store disabled"
        )
        url = None

    timeout = DEFAULT_TIMEOUT
    raw_timeout = _nonempty(env, TIMEOUT_ENV)
    if raw_timeout is not None:
        given = _number(raw_timeout, float, lambda t: math.isfinite(t) and t > 0)
        if given is None:
            errors.append(
                f"{TIMEOUT_ENV}={raw_timeout!r} is not a positive number of seconds; "
                f"using {DEFAULT_TIMEOUT}"
            )
        else:
            timeout = given

    threshold = 1
    raw_threshold = _nonempty(env, THRESHOLD_ENV)
    if raw_threshold is not None:
        given_threshold = _number(raw_threshold, int, lambda n: n >= 1)
        if given_threshold is None:
            # Falling back to 1 would weaken a policy someone asked for: refuse plans instead.
            errors.append(
                f"{THRESHOLD_ENV}={raw_threshold!r} is not a positive integer; "
                "no plan will be trusted"
            )
            threshold = 0
        else:
            threshold = given_threshold

    options: dict[str, Any] = {}
    raw_options = _nonempty(env, STORAGE_OPTIONS_ENV)
    if raw_options is not None:
        try:
            options = parse_storage_options(raw_options)
        except ValueError as exc:
            errors.append(f"{STORAGE_OPTIONS_ENV}: {exc}; store disabled")
            url = None

    replicas = 1
    raw_replicas = _nonempty(env, SET_REPLICAS_ENV)
    if raw_replicas is not None:
        given_replicas = _number(raw_replicas, int, lambda n: 1 <= n <= 64)
        if given_replicas is None:
            errors.append(
                f"{SET_REPLICAS_ENV}={raw_replicas!r} is not 1 to 64; reading the plan set itself"
            )
        else:
            replicas = given_replicas

    return PluginConfig(
        url=url,
        set_replicas=replicas,
        trusted_keys=_nonempty(env, TRUSTED_KEYS_ENV),
        threshold=threshold,
        signing_key=_nonempty(env, SIGNING_KEY_ENV),
        timeout=timeout,
        storage_options=options,
        sign_cold=_nonempty(env, SIGN_COLD_ENV) == "1",
        errors=tuple(errors),
    )
