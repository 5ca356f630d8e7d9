"""Whole-store work beside the resolver: push a directory's plans (prune: :mod:`.pruning`).

It moves bytes only; what may be uploaded (signed, or explicitly allowed unsigned) is decided
here from the trust core's answers, and the command only renders the outcome. It can be a dry
run that changes nothing, local or remote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from ..storage.listing import md5_hex
from ..storage.local.localdir import LocalPlanDir
from ..storage.store import Store
from ..trust.errors import PlanCacheError
from ..trust.keyring.keys import Signer
from ..trust.plans.gate import Verdict
from ..trust.plans.plan import (
    fingerprint_of_plan_name,
    fingerprint_of_sig_name,
    plan_name,
    sig_name,
)
from .audit import Tally
from .directory_signing import SigningRequest, sign_one

if TYPE_CHECKING:
    from ..clock import Deadline

__all__ = ["PushEntry", "PushRequest", "push_plans"]


@dataclass
class PushEntry:
    fingerprint: str
    action: str = ""
    """``uploaded``, ``unchanged`` or ``refused`` (in a dry run: what would happen)."""
    detail: str = ""
    """Why refused; or ``signed`` (a new signature was made), ``signed first`` (dry run: would
    be), ``unsigned``."""


@dataclass(frozen=True)
class PushRequest:
    """What a push was asked to do, beyond where from and where to."""

    signer: Signer | None = None
    """Signs plans that lack a current signature first; None uploads what is already signed."""
    signing: SigningRequest = field(default_factory=SigningRequest)
    allow_unsigned: bool = False
    fingerprints: Sequence[str] | None = None
    """Only these plans (a missing one is refused); None: every plan in the directory."""
    dry_run: bool = False
    """Sign nothing, upload nothing: the entries say what would happen."""


def _fp_of(name: str) -> str:
    return fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name) or name


def _unchanged(store: Store, objects: dict[str, bytes], deadline: Deadline) -> set[str]:
    """Names whose bytes the store already holds: decided from the listing's size and MD5
    when it states them (S3, GCS: no download); otherwise same-size objects are fetched."""
    listing = store.list_objects(deadline)
    same: set[str] = set()
    to_compare: set[str] = set()
    for name, data in objects.items():
        info = listing.get(name)
        if info is None or (info.size is not None and info.size != len(data)):
            continue
        if info.md5 is not None:
            if info.md5 == md5_hex(data):
                same.add(name)
        else:
            to_compare.add(name)
    fps = sorted({_fp_of(n) for n in to_compare})
    for remote in store.fetch_many(fps, deadline):
        for name, held in (
            (plan_name(remote.fingerprint), remote.plan_bytes),
            (sig_name(remote.fingerprint), remote.sig_bytes),
        ):
            if name in to_compare and held is not None and held == objects[name]:
                same.add(name)
    return same


def _plan_share(objects: dict[str, bytes], progress: Tally | None) -> Callable[[int], None] | None:
    """Progress per uploaded object, counted in plans (a plan is its plan and sidecar objects)."""
    if progress is None or not objects:
        return None
    plans = len({_fp_of(n) for n in objects})
    progress.start(plans)
    share = plans / len(objects)
    return lambda count: progress.advance(count * share)


def push_plans(
    directory: LocalPlanDir,
    store: Store,
    deadline: Deadline,
    now: datetime,
    *,
    push: PushRequest = PushRequest(),
    progress: Tally | None = None,
) -> tuple[list[PushEntry], int]:
    """Sign (with ``push.signer``) and upload every plan and sidecar the store lacks byte for
    byte.

    A dry run's entries say what would happen (a plan that would be signed first counts as
    one to upload). Returns one entry per plan and the number of objects uploaded (or that
    would be).
    """
    signer, request, allow_unsigned, fingerprints, dry_run = (
        push.signer,
        push.signing,
        push.allow_unsigned,
        push.fingerprints,
        push.dry_run,
    )
    entries: list[PushEntry] = []
    objects: dict[str, bytes] = {}
    names: dict[str, list[str]] = {}
    would_sign: set[str] = set()
    signed: set[str] = set()
    listed = directory.fingerprints()  # sorted: the report's order, as verify's and ls's
    present = set(listed)
    for fp in listed if fingerprints is None else list(dict.fromkeys(fingerprints)):
        entry = PushEntry(fp)
        entries.append(entry)
        if fp not in present:
            entry.action, entry.detail = (
                "refused",
                f"{Verdict.NO_PLAN}: no plan file {plan_name(fp)} in {directory}",
            )
            continue
        try:
            if signer is not None:
                outcome = sign_one(directory, fp, signer, now, request, write=not dry_run)
                if outcome.refused:
                    entry.action, entry.detail = "refused", f"{outcome.reason}: {outcome.detail}"
                    continue
                if outcome.action in ("signed", "replaced"):
                    signed.add(fp)  # a fresh statement: it records this request's facts
                if dry_run and outcome.action != "kept":
                    would_sign.add(fp)
            plan, sig = directory.read(fp)
        except PlanCacheError as exc:
            entry.action, entry.detail = "refused", f"{exc.reason.value}: {exc.detail}"
            continue
        if plan is None:
            entry.action, entry.detail = "refused", f"{Verdict.NO_PLAN}: plan file vanished"
            continue
        if fp in would_sign:
            names[fp] = [plan_name(fp), sig_name(fp)]
            objects[plan_name(fp)] = plan
            continue  # its sidecar does not exist yet: it is certainly uploaded
        if sig is None and not allow_unsigned:
            entry.action, entry.detail = (
                "refused",
                "unsigned (sign it: --key KEY, or --allow-unsigned)",
            )
            continue
        names[fp] = [plan_name(fp)] + ([sig_name(fp)] if sig is not None else [])
        objects[plan_name(fp)] = plan
        if sig is not None:
            objects[sig_name(fp)] = sig
    same = _unchanged(store, objects, deadline) if objects else set()
    upload = {n: d for n, d in objects.items() if n not in same}
    upload_names = set(upload) | {sig_name(fp) for fp in would_sign}
    if not dry_run:
        store.put_many(upload, deadline, on_done=_plan_share(upload, progress))
    for entry in entries:
        if entry.fingerprint in names:
            mine = names[entry.fingerprint]
            entry.action = "uploaded" if any(n in upload_names for n in mine) else "unchanged"
            entry.detail = (
                "signed first"
                if entry.fingerprint in would_sign
                else "signed"
                if entry.fingerprint in signed
                else "unsigned"
                if len(mine) == 1
                else ""
            )
    return entries, len(upload_names)
