"""An audit names every candidate it judged: the other plans attached to an image for one name.

With a ``subject`` a plan's name can be claimed by several manifests attached to the image
(:mod:`..storage.oci.candidate_reads`); a read takes the newest, and a reader whose newest
fails verification tries the others (:meth:`.resolver.Resolver.another_candidate`). An audit
(``verify``, ``ls``) reports the newest, as before, and for one that fails it judges the others
too and names each in the report (``candidates``: digest, status, reason, detail) and in its
detail, so the operator sees what a reader would take instead and that ``prune --invalid
--subject`` has something to remove. At most the candidates a reader tries, within the audit's
deadline; a registry that cannot say leaves the report as it was, with a note.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..trust.errors import PlanCacheError
from ..trust.result import PlanResult

if TYPE_CHECKING:
    from ..clock import Deadline
    from ..storage.store import Store
    from .audit import PlanReport


def note_candidates(
    store: Store,
    reports: Iterable[PlanReport],
    judge: Callable[[PlanResult], PlanReport],
    deadline: Deadline,
) -> None:
    """For each of ``reports`` (plans that failed verification: not a store error, not missing)
    in a store with a subject, judge the other candidates with ``judge`` and name them there."""
    if store.subject is None:
        return
    from ..storage.oci.candidate_reads import other_plans

    for report in reports:
        try:
            others = other_plans(store, report.fingerprint, deadline)
        except PlanCacheError as exc:
            report.detail += f"; the other candidates could not be read ({exc.detail})"
            continue
        for digest, result in others:
            other = judge(result)
            report.candidates.append(
                {
                    "digest": digest,
                    "status": other.status,
                    "reason": other.reason,
                    "detail": other.detail,
                    "valid": other.ok,
                }
            )
        if report.candidates:
            valid = [c["digest"] for c in report.candidates if c["valid"]]
            said = (
                f"an older one, {valid[0]}, verifies: readers take it" if valid else "none verifies"
            )
            report.detail += (
                f"; {len(report.candidates)} other candidate(s) attached to the image, {said} "
                "(prune --invalid --subject removes those that fail)"
            )
