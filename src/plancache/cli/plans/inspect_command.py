"""``plancache inspect``: one plan file (or its sidecar) and its signature, shown in detail.

Apart from the offline audit (:mod:`.offline`) because it reads one named file, local or in a
store, and shows every field of its envelope and statement, where ``verify`` and ``ls`` report
a whole location one row per plan; the verdict comes from the same
:func:`~plancache.pipeline.audit.check`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...pipeline.audit import check
from ...pipeline.keyless_report import UNVERIFIED_KEYLESS
from ...pipeline.resolver import utcnow
from ...storage.local.localdir import LocalPlanDir
from ...trust import envelope as dsse
from ...trust import strictjson
from ...trust.display import safe_text
from ...trust.envelope import is_bundle
from ...trust.errors import ConfigError, PlanCacheError
from ...trust.plans.plan import fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name
from ...trust.result import PlanResult
from ...trust.sealing import claimed_payload
from ...trust.statement import format_time, parse_statement
from ..flag_objects import optional_policy, storage_options
from ..output import report


def cmd_inspect(args: argparse.Namespace) -> int:
    """Show one plan (or its sidecar) and its signature, field by field or as JSON.

    Raises:
        ConfigError: the name is not a plan's or a sidecar's, or neither exists
            (``config-error``).
        PlanCacheError: the store could not be read (the fetch's own error, e.g.
            ``store-error`` or ``timeout``).
    """
    from ...pipeline.locations import is_url, open_url
    from ...settings import DEFAULT_TIMEOUT
    from ...storage.local.files import read_capped
    from ...trust.plans.plan import MAX_PLAN_BYTES

    url = str(args.file) if is_url(args.file) else ""
    parent, _, name = url.rpartition("/") if url else ("", "", Path(args.file).name)
    fp = fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name)
    if fp is None:
        raise ConfigError(f"{name} is not named startup_plan_<16 hex>.json or .json.sig")
    if parent:  # a store URL: the plan and its sidecar, fetched as pull fetches them
        store = open_url(
            parent, storage_options(args), DEFAULT_TIMEOUT if args.timeout is None else args.timeout
        )
        fetched = store.fetch(fp)
        if fetched.error is not None:
            raise fetched.error
        plan_bytes, sig_bytes, where = (
            fetched.plan_bytes,
            fetched.sig_bytes,
            f"{store.url}/{plan_name(fp)}",
        )
        if plan_bytes is None and sig_bytes is None:
            raise ConfigError(f"{args.file} does not exist")
    else:
        path = Path(args.file)
        directory = LocalPlanDir(path.parent)
        plan_bytes, sig_bytes = directory.read(fp)
        where = str(directory.path / plan_name(fp))
        if plan_bytes is None and read_capped(path, MAX_PLAN_BYTES) is None:
            raise ConfigError(f"{path} does not exist")
    policy = optional_policy(args)
    result = check(
        PlanResult(fp, "store" if parent else "local", plan_bytes, sig_bytes), policy, utcnow()
    )
    info: dict[str, Any] = {"file": where, **result.to_json()}
    if sig_bytes is not None and is_bundle(sig_bytes):
        info["bundle"], info["statement"] = _bundle_json(sig_bytes)
    elif sig_bytes is not None:
        try:
            env = dsse.decode(sig_bytes)
            info["envelope"] = {
                "payloadType": env.payload_type,
                "keyids": [
                    UNVERIFIED_KEYLESS if s.ext is not None else s.keyid for s in env.signatures
                ],
            }
            info["statement"] = _statement_json(env.payload)
        except PlanCacheError as exc:
            info["envelope"] = {"error": f"{exc.reason.value}: {exc.detail}"}
    ok = result.status in ("valid", "unverified")
    if args.json:
        report(args, ok, **info)
    else:
        for key, value in _flatten("", info):
            print(f"{key:44} {safe_text(value, 2000)}".rstrip())
    return 0 if ok else 1


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    """Nested JSON as ``a.b  value`` lines: no Python reprs in human output."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(f"{prefix}.{key}" if prefix else str(key), inner)
    elif isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            for i, inner in enumerate(value):
                yield from _flatten(f"{prefix}.{i + 1}", inner)
        else:
            yield prefix, ", ".join(str(v) for v in value)
    else:
        yield (
            prefix,
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value),
        )


def _bundle_json(sig_bytes: bytes) -> tuple[dict[str, Any], Any]:
    """A Sigstore bundle's media type and payload type, and the statement its DSSE payload
    claims: what the file says, as an envelope's fields are shown. Who signed comes only from
    the verification above (``signed_by``), never from the certificate the bundle carries."""
    try:
        obj = strictjson.loads(sig_bytes[: dsse.MAX_SIG_BYTES], "Sigstore bundle")
        inner = obj.get("dsseEnvelope") if isinstance(obj, dict) else None
        bundle = {
            "mediaType": obj.get("mediaType") if isinstance(obj, dict) else None,
            "payloadType": inner.get("payloadType") if isinstance(inner, dict) else None,
        }
        return bundle, _statement_json(claimed_payload(sig_bytes))
    except PlanCacheError as exc:
        return {"error": f"{exc.reason.value}: {exc.detail}"}, None


def _statement_json(payload: bytes) -> Any:
    try:
        st = parse_statement(payload)
    except PlanCacheError as exc:
        return {"error": f"{exc.reason.value}: {exc.detail}"}
    return {
        "subject": st.subject_name,
        "sha256": st.subject_sha256,
        "fingerprint": st.fingerprint,
        "signed_at": format_time(st.signed_at),
        "expires_at": format_time(st.expires_at) if st.expires_at else None,
        "comment": st.comment,
        "provenance": dict(st.provenance),
        "evidence": dict(st.evidence) if st.evidence else "none",
    }
