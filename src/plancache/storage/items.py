"""The unit every plan source yields: one fingerprint with its raw, unverified bytes.

It lives in ``storage`` because both readers (a local directory, an object store) produce it
and the CLI's reports and the vLLM plugin consume it; nothing in it is trusted yet.
"""

from __future__ import annotations

from ..trust.errors import PlanCacheError

Item = tuple[str, "bytes | PlanCacheError | None", "bytes | None"]
"""(fingerprint, plan bytes, sidecar bytes); a plan that could not be read carries its error."""

__all__ = ["Item", "PlanCacheError"]
