"""Parsed flags and the environment -> library objects, for the commands that run.

Trust options (``--trusted-keys``, ``--threshold``) become a
:class:`~plancache.trust.policy.TrustPolicy`; ``--key`` a signer; ``--storage-option``
merged over ``$PLANCACHE_STORAGE_OPTIONS`` (and the S3 shorthands, and whether a registry is
read itself or through the node's mirror) the store's options; DIR and URL positionals are
checked for being swapped. Nothing here decides trust. Apart from :mod:`plancache.cli.parser`,
which declares the flags, because this module reaches into the library (imported inside the
functions that build its objects) and ``plancache --help`` must not.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..settings import (
    SIGNING_KEY_ENV,
    SIGSTORE_ID_TOKEN_FILE_ENV,
    SIGSTORE_TRUSTED_ROOT_ENV,
    TRUSTED_KEYS_ENV,
)
from ..trust.errors import ConfigError

if TYPE_CHECKING:
    from ..pipeline.directory_signing import SigningRequest
    from ..trust.keyring.keys import Signer
    from ..trust.policy import TrustPolicy


def apply_keyless_flags(args: argparse.Namespace) -> None:
    """Put the keyless flags given in this run into the environment the library reads (the
    plugin has no flags): flags, then environment. The token's path travels, never the token."""
    token_file = getattr(args, "identity_token", None)
    if token_file:
        os.environ[SIGSTORE_ID_TOKEN_FILE_ENV] = str(token_file)
    root = getattr(args, "trusted_root", None)
    if root:
        os.environ[SIGSTORE_TRUSTED_ROOT_ENV] = str(root)


PLACES = {"push": ("dir", "url"), "pull": ("url", "dir"), "sign": ("dir",)}
"""Each command's DIR and URL positionals, in the order it takes them."""


def check_places(args: argparse.Namespace) -> None:
    """A store URL where a directory goes (or the reverse) is named as such, never mangled into a
    path: ``push s3://b/p plans`` says the two are swapped instead of uploading to ``./plans``.

    Raises:
        ConfigError: DIR and URL swapped, a URL given as DIR, or a URL without a scheme
            (``config-error``).
    """
    from ..pipeline.locations import is_url

    order = PLACES[args.command]
    usage = f"plancache {args.command} {' '.join(n.upper() for n in order)}"
    values = {name: getattr(args, name) for name in order}
    wrong = [
        name
        for name, value in values.items()
        if value is not None and is_url(value) != (name == "url")
    ]
    if len(wrong) == 2:
        raise ConfigError(
            f"DIR and URL are swapped: {usage} (got the store URL {values['dir']!r} as DIR and "
            f"{values['url']!r} as URL)"
        )
    if wrong == ["dir"]:
        raise ConfigError(
            f"DIR {values['dir']!r} is a store URL, not a local plan directory ({usage})"
        )
    if wrong == ["url"]:
        raise ConfigError(
            f"URL {values['url']!r} is not a store URL such as s3://bucket/prefix, "
            f"gs://bucket/prefix or file:///path ({usage})"
        )


def wanted_fingerprints(args: argparse.Namespace) -> list[str]:
    """``--fingerprint`` values, each once, each 16 lowercase hex (else one line).

    Raises:
        ConfigError: a value is not 16 lowercase hex (``config-error``).
    """
    from ..trust.plans.plan import is_fingerprint

    wanted = list(dict.fromkeys(args.fingerprint or []))
    bad = [fp for fp in wanted if not is_fingerprint(fp)]
    if bad:
        raise ConfigError(f"not a plan fingerprint (16 lowercase hex): {bad[0]!r}")
    return wanted


def required_policy(args: argparse.Namespace, *, revocations_only: bool = False) -> TrustPolicy:
    """The signed policy the command needs; one line when no trusted keys are named.
    ``revocations_only``: a file of ``@revoked`` lines alone will do (``prune --revoked``).

    Raises:
        ConfigError: no trusted keys named (``--trusted-keys``, ``$PLANCACHE_TRUSTED_KEYS``), or
            the keys cannot be used (``config-error``).
    """
    from ..pipeline.trust_config import keys_source, trust_policy

    source = keys_source(args.trusted_keys)
    if not source:
        raise ConfigError(f"no trusted keys: pass --trusted-keys FILE or set {TRUSTED_KEYS_ENV}")
    return trust_policy(source, args.threshold, revocations_only)


def optional_policy(args: argparse.Namespace) -> TrustPolicy | None:
    """The signed policy when trusted keys are named, else None (values shown unverified)."""
    from ..pipeline.trust_config import keys_source, trust_policy

    source = keys_source(args.trusted_keys)
    return trust_policy(source, getattr(args, "threshold", 1)) if source else None


def required_signer(args: argparse.Namespace) -> Signer:
    """The signer ``--key`` (else ``$PLANCACHE_SIGNING_KEY``) names.

    Raises:
        ConfigError: no key named, or the key cannot be loaded (``config-error``).
    """
    from ..pipeline.trust_config import signer_for
    from .keys_cmd import terminal_prompt

    signer = signer_for(args.key, prompt=terminal_prompt())
    if signer is None:
        raise ConfigError(f"no signing key: pass --key KEYREF or set {SIGNING_KEY_ENV}")
    return signer


def signing_request(args: argparse.Namespace) -> SigningRequest:
    """What ``sign``/``push --key`` would sign; absent flags are "not asked" (None)."""
    from ..pipeline.directory_signing import SigningRequest
    from ..pipeline.trust_config import keys_source, load_trusted_keys

    source = keys_source(args.trusted_keys)
    keyring = load_trusted_keys(source) if source else None
    facts = dict(args.fact) if args.fact else None
    _check_fact_names(facts or {})
    inputs, parts = (
        fingerprint_inputs_file(args.inputs) if getattr(args, "inputs", None) else (None, None)
    )
    asked = (args.expires_in, args.comment, facts, keyring, args.replace, inputs, parts)
    return SigningRequest(*asked, sign_cold=bool(getattr(args, "sign_cold", False)))


MAX_INPUTS_FILE = 4 * 2**20


def fingerprint_inputs_file(path: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """``--inputs FILE``: ``plancache fingerprint --json``'s report -> (fingerprint -> its inputs,
    the configuration's parts); every rank's inputs must reproduce its fingerprint (vLLM's
    digest), else one line.

    Raises:
        ConfigError: the file cannot be read, is not ``plancache fingerprint --json``'s report
            (no ranks), a rank's factors do not hash to its fingerprint, or its inputs are not
            well formed (``config-error``).
    """
    from pathlib import Path

    from ..storage.local.files import read_capped
    from ..trust import strictjson
    from ..trust.errors import PlanCacheError
    from ..trust.inputs import check_inputs, fingerprint_of_inputs

    try:
        data = read_capped(Path(path), MAX_INPUTS_FILE, follow_symlinks=True)
        doc = strictjson.loads(data, path) if data is not None else None
        ranks = doc.get("ranks") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(ranks, list) or not ranks:
            raise ConfigError(
                f"--inputs {path}: not the JSON of plancache fingerprint --json (no ranks)"
            )
        found = {}
        for entry in ranks:
            factors = check_inputs(
                entry.get("factors") if isinstance(entry, dict) else None, "--inputs factors"
            )
            if fingerprint_of_inputs(factors) != entry.get("fingerprint"):
                raise ConfigError(
                    f"--inputs {path}: the factors of rank {entry.get('rank')} do not hash to "
                    "its fingerprint"
                )
            found[entry["fingerprint"]] = factors
        parts = doc.get("config_parts")
        checked = check_inputs(parts, "--inputs config_parts") if isinstance(parts, dict) else None
        return found, checked
    except ConfigError:
        raise
    except PlanCacheError as exc:
        raise ConfigError(f"--inputs {path}: {exc.detail}") from None


def _check_fact_names(facts: Mapping[str, Any]) -> None:
    """An unknown ``--fact`` names the known ones (and the nearest), before anything is signed."""
    from ..trust.statement import PROVENANCE_KEYS
    from .suggest import did_you_mean

    for key in facts:
        if key not in PROVENANCE_KEYS:
            raise ConfigError(
                f"unknown --fact {key!r}{did_you_mean(key, PROVENANCE_KEYS)} "
                f"(known facts: {', '.join(sorted(PROVENANCE_KEYS))})"
            )


def storage_options(
    args: argparse.Namespace, env: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """``$PLANCACHE_STORAGE_OPTIONS`` overridden by ``--storage-option`` flags.

    Raises:
        ConfigError: ``--subject`` given empty (``--subject "$IMAGE"`` with the variable unset
            would otherwise read, and ``prune`` delete, the whole repository's plans instead of
            the image's).
    """
    from ..pipeline.locations import storage_options_for

    options = storage_options_for(dict(getattr(args, "storage_option", None) or []), env)
    subject = getattr(args, "subject", None)
    if subject is not None and not subject.strip():
        raise ConfigError("--subject is empty: name the image (TAG, @sha256:..., HOST/REPO:TAG)")
    if subject:  # --subject IMAGE: a registry store's option (storage/oci/registry.py)
        options["subject"] = subject
    return {**options, **_s3_shorthands(args, options), **origin_reads(args, options)}


def _s3_shorthands(args: argparse.Namespace, options: Mapping[str, Any]) -> dict[str, Any]:
    """``--endpoint-url``, ``--profile``, ``--region`` as the storage options they stand for (they
    win over ``--storage-option``); ``--profile`` and ``--region`` only for an ``s3://`` URL."""
    from ..pipeline.locations import is_url

    given = {flag: getattr(args, flag, None) for flag in ("endpoint_url", "profile", "region")}
    if not any(given.values()):
        return {}
    url = next(
        (v for v in (getattr(args, a, None) for a in ("url", "location", "file")) if is_url(v)), ""
    )
    scheme = str(url).partition("://")[0].lower()
    for flag in ("profile", "region"):
        if given[flag] and scheme not in ("s3", "s3a"):
            raise ConfigError(
                f"--{flag} is for s3:// URLs, not {scheme or 'a local directory'} "
                "(use --storage-option for other stores)"
            )
    extra: dict[str, Any] = {}
    if given["endpoint_url"]:
        extra["endpoint_url"] = given["endpoint_url"]
    if given["profile"]:
        extra["profile"] = given["profile"]
    if given["region"]:
        client = options.get("client_kwargs")
        extra["client_kwargs"] = {
            **(client if isinstance(client, Mapping) else {}),
            "region_name": given["region"],
        }
    return extra


# Which commands read a registry itself, never the mirror a node configures for it.
#
# ``verify``, ``ls`` and ``prune --dry-run`` audit: a report about ``oci://registry/…`` that was
# read from a mirror would name the registry while it received no request (the mirror may be
# stale or serve what the registry no longer holds). They get ``mirror_reads=false`` unless the
# operator gives ``mirror_reads`` (``true`` audits through the mirror, named in the output).
# ``push`` (plans or a compile cache) decides what is already stored, and ``prune`` (without
# ``--dry-run``) what to delete, and no write or listing for a write may go through a mirror:
# they always get ``mirror_reads=false`` (the storage layer's
# :func:`~plancache.storage.oci.registry_urls.write_options`, as the plugin's own pushes do). A
# prune judged on a mirror's listing deleted the registry's plan set when the mirror's tag list
# left out one of its plans (``redteam/poc_prune_sets_via_mirror.py``). ``pull`` and the
# plugin's boot read through the mirror: that is what it is for.

AUDITS = frozenset({"verify", "ls", "prune"})
WRITES = frozenset({"push"})
"""Commands that always read the registry itself; ``prune`` is one unless ``--dry-run``."""


def origin_reads(args: argparse.Namespace, options: Mapping[str, Any]) -> dict[str, Any]:
    """``{"mirror_reads": False}`` for a push or a prune that deletes, or an audit whose
    options do not say ``mirror_reads``, on a registry store URL; nothing otherwise (no other
    store takes it)."""
    from ..storage.oci.registry_urls import write_options

    command = getattr(args, "compile_command", None) or getattr(args, "command", None)
    deletes = command == "prune" and not getattr(args, "dry_run", False)
    if (
        command not in WRITES
        and not deletes
        and (command not in AUDITS or "mirror_reads" in options)
    ):
        return {}
    for name in ("url", "location", "target", "root"):
        place = getattr(args, name, None)
        if isinstance(place, str) and "mirror_reads" in write_options(place, {}):
            return {"mirror_reads": False}
    return {}
