"""Plan set objects on a store: one read, listing, upload and delete, beside the per-plan layout.

A set (``startup_planset_<id>.set``, see :mod:`plancache.trust.plans.plan_set`) is one more object
under the same prefix as the plans; this module moves its bytes and decides nothing. The
boot's read goes through the same paths as a plan's: on ``s3://`` before s3fs exists, plain
botocore (:mod:`.s3.direct`); otherwise the store's capped read (:meth:`.store.Store.read`), each
inside the caller's deadline and with the shared retries (:mod:`.deadline`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..clock import Deadline
from ..trust.plans.plan_set_names import set_object_id
from .deadline import THROTTLED, http_status

if TYPE_CHECKING:
    from ..trust.errors import PlanCacheError
    from .store import Store


def read_set(store: Store, name: str, deadline: Deadline | None = None) -> bytes | None:
    """A set (or replica) object's bytes, capped (None if absent); raw and unverified; the
    read's errors are :meth:`.store.Store.read`'s.

    Raises:
        Rejected: ``name`` is not a plan set's (reason ``malformed``).
    """
    set_object_id(name) or _not_a_set(name)
    return store.read(name, store.deadline(deadline))


def throttled(exc: BaseException) -> bool:
    """A read the store refused for load (429, 503) after its tries, by the SDK's status kept in
    the typed error's chain: a node then asks that store for nothing more in this budget (a
    fallback to the per-plan objects would be 2 reads per rank against a store asking for
    fewer)."""
    return http_status(exc) in THROTTLED


def set_names(store: Store, deadline: Deadline | None = None) -> list[str]:
    """The set and replica objects directly under the prefix, sorted (one listing, the plans'
    own)."""
    return sorted(info.name for info in store.iter_objects(deadline) if set_object_id(info.name))


def delete_sets(
    store: Store, names: Iterable[str], deadline: Deadline | None = None
) -> dict[str, PlanCacheError]:
    """Delete set objects; one already gone is not an error. Returns those that could not be
    deleted, each with its error: prune must name every set left behind (it would go on serving
    what prune deletes), so after a failed batch each set is retried alone to learn which.

    Raises:
        Rejected: a name that is not a plan set's, before anything is deleted (reason
            ``malformed``).
    """
    from ..trust.errors import PlanCacheError

    wanted = [n for n in names if set_object_id(n) or _not_a_set(n)]
    deadline = store.deadline(deadline)
    try:
        store.delete_objects(wanted, deadline)
        return {}
    except PlanCacheError:
        pass
    failed: dict[str, PlanCacheError] = {}
    for name in wanted:  # the deleted ones are gone now: deleting them again succeeds at once
        try:
            store.delete_objects([name], deadline)
        except PlanCacheError as exc:
            failed[name] = exc
    return failed


def _not_a_set(name: str) -> bool:
    from ..trust.display import safe_text
    from ..trust.errors import Reason, Rejected

    raise Rejected(Reason.MALFORMED, f"not a plan set name: '{safe_text(name, 80)}'")
