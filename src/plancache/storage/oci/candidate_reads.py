"""The other candidates of an object attached to an image, for a reader whose first one failed.

With a ``subject`` an object's name can be claimed by several manifests attached to the image
(:meth:`.registry.RegistryBackend.candidate_manifests`: newest first, at most
``MAX_CANDIDATES``). Whether a candidate's signature verifies shows only in the trust core,
after the read: a co-tenant who may push but holds no key could attach a plan or a compile
cache with a signature that does not verify (or a genuine signature beside other content) and
hide the signed object from every reader (issue 47, item 3). So a reader whose object from such
a store fails verification asks here for the others and verifies each itself; nothing here
judges them.

A module of its own, beside the registry's :meth:`.registry.RegistryBackend.other_candidates`
(the registry's call that reads them), because its interface is the reader's: it takes the
:class:`~..store.Store` a reader holds and runs under that reader's deadline, as the pipeline's
other store calls do. One way for every kind: a plan reader (:func:`other_plans`) and a
compile-cache reader (``pipeline.compile_cache.flows``) both take :func:`other_candidates`, then
read a candidate's content with :func:`candidate_content` (only once its signature verified,
capped at the size it signs: a compile cache's archive is a blob read by digest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...clock import Deadline
from ...trust.errors import PlanCacheError, Reason, Rejected
from ...trust.plans.plan import plan_name, sig_name
from ...trust.result import PlanResult
from ..deadline import run_by
from ..listing import cap_for
from .registry import Candidate, RegistryBackend

if TYPE_CHECKING:
    from ..store import Store


def _registry(store: Store) -> RegistryBackend | None:
    """The store's registry backend when its objects are attached to an image, else None."""
    if store.subject is None:
        return None
    backend = store.backend
    return backend if isinstance(backend, RegistryBackend) else None


def other_candidates(
    store: Store, name: str, sig_cap: int, *, deadline: Deadline | None = None
) -> list[Candidate]:
    """Each signed candidate for object ``name`` attached to the store's image after the one a
    read takes, newest first, its signature read (at most ``sig_cap`` bytes); none for a store
    without a subject, or any other kind of store.

    Raises:
        PlanCacheError: the registry could not be read (``StoreTimeout`` at the deadline).
    """
    fs = _registry(store)
    if fs is None:
        return []
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    return run_by(
        fs.loop,
        lambda: fs.other_candidates(name, sig_cap),
        deadline,
        f"cannot read the other candidates of {name} in {store.url}",
        store.timeout,
    )


def candidate_content(
    store: Store, candidate: Candidate, cap: int, *, deadline: Deadline | None = None
) -> bytes:
    """The candidate's content (embedded in its manifest, else its blob by digest), at most
    ``cap`` bytes: a reader asks for it only after the candidate's signature verified, with the
    size that signature states.

    Raises:
        Rejected: larger than ``cap`` (``too-large``), or other bytes than its descriptor states
            (``digest-mismatch``).
        PlanCacheError: the registry could not be read (``StoreTimeout`` at the deadline).
    """
    layer = candidate.content
    if layer.size > cap:
        raise Rejected(Reason.TOO_LARGE, f"candidate {candidate.digest[:19]}… is over {cap} bytes")
    if layer.data is not None:
        return layer.data
    fs = _registry(store)
    assert fs is not None  # a candidate comes from such a store only
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    return run_by(
        fs.loop,
        lambda: fs.reader.blob(layer.digest, layer.size, cap),
        deadline,
        f"cannot read candidate {candidate.digest[:19]}… in {store.url}",
        store.timeout,
    )


def other_plans(
    store: Store, fp: str, deadline: Deadline | None = None
) -> list[tuple[str, PlanResult]]:
    """(manifest digest, raw unverified store result) for plan ``fp`` from each signed candidate
    after the one a read takes (:func:`other_candidates`; none for another store); the caller
    verifies each (a reader takes the first that verifies, an audit names them all).

    Raises:
        PlanCacheError: the registry could not be read (``StoreTimeout`` at the deadline).
    """
    name = plan_name(fp)
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    results = []
    for candidate in other_candidates(store, name, cap_for(sig_name(fp)), deadline=deadline):
        try:
            plan = candidate_content(store, candidate, cap_for(name), deadline=deadline)
        except PlanCacheError:  # this candidate's content is not to be had: the next one's may
            continue
        results.append((candidate.digest, PlanResult(fp, "store", plan, candidate.signature)))
    return results
