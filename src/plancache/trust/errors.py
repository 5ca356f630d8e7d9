"""Errors in kinds, as python-tuf splits bad data from failed downloads.

Every error carries a short, stable ``reason`` code (logs, ``--json`` output, the plugin's
decision line) and a one-line human ``detail``. The *kind* says what went wrong, so callers
decide by type, never by reading text:

- :class:`Rejected`: bytes that failed a check (plan, sidecar, statement, a signer's key).
  Another source may hold good bytes; these must never be used.
- :class:`StoreError`: the bytes could not be moved (a store or a disk failed). Its
  ``transient`` flag says whether another try inside the deadline may succeed;
  :class:`StoreTimeout` is the deadline itself running out.
- :class:`ConfigError`: the operator's settings are wrong (a missing key file, a bad URL).

Gate outcomes (applied, below the baseline, ...) are not errors: they are
:class:`plancache.trust.plans.gate.Verdict` values.
"""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):
    """Stable reason codes. The string values are a contract: scripts grep for them."""

    UNSIGNED = "unsigned"
    TOO_LARGE = "too-large"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad-signature"
    UNTRUSTED_KEY = "untrusted-key"
    REVOKED = "revoked"
    THRESHOLD = "threshold-not-met"
    DIGEST_MISMATCH = "digest-mismatch"
    NAME_MISMATCH = "name-mismatch"
    FINGERPRINT_MISMATCH = "fingerprint-mismatch"
    EXPIRED = "expired"
    NOT_YET_VALID = "not-yet-valid"
    STATEMENT_MISMATCH = "statement-mismatch"
    """``sign`` refuses to adopt a sidecar whose statement says something else than asked."""
    STORE_ERROR = "store-error"
    TIMEOUT = "timeout"
    LOCAL_ERROR = "local-error"
    """A local disk or permission failure (ENOSPC, EACCES, EROFS, EXDEV, EEXIST): never a verdict
    on the bytes; the cache stays as it is for a later boot."""
    UNSAFE_DIRECTORY = "unsafe-directory"
    """A directory or lock file plancache would trust is a link, another user's, or open to
    group/world writes: never used."""
    LOCK_UNAVAILABLE = "lock-unavailable"
    """The node lock cannot be taken safely (not openable, not ours): the work stops, never
    unlocked."""
    NO_PRIVATE_DIR = "no-private-dir"
    """No private place this worker owns, on a filesystem where code can be mapped: vLLM compiles
    cold."""
    PRIVATE_DATA = "private-data"
    """A compile cache or header about to be pushed carries a secret or private path of the build
    node (torch's environment snapshot, a credential, an internal address, a home directory):
    not pushed; the detail names the variable and the file, never the value."""
    WRONG_ISSUER = "wrong-issuer"
    """A Sigstore bundle whose certificate's identity is trusted, but from another OIDC issuer."""
    WRONG_IDENTITY = "wrong-identity"
    """A Sigstore bundle signed by an identity no ``sigstore`` line trusts."""
    UNANCHORED_IDENTITY = "unanchored-identity"
    """A trusted ``identity-regexp`` matches only inside the certificate's SAN, not from its
    start: the near miss of a forgotten leading anchor, never a match (an exact line, or an
    expression that matches the SAN's start, is ``wrong-identity``)."""
    CERT_OUTSIDE_VALIDITY = "certificate-outside-validity"
    """The bundle's signing certificate was not valid at the time the log (or a TSA) recorded."""
    NO_LOG_PROOF = "no-log-proof"
    """A bundle without a transparency-log inclusion proof (with checkpoint) or a trusted time."""
    BAD_LOG_PROOF = "bad-log-proof"
    """The inclusion proof, checkpoint, SET or log entry does not verify against the trust root."""
    FOREIGN_TRUST_ROOT = "foreign-trust-root"
    """The certificate does not chain to the pinned Sigstore trust root (another instance's)."""
    RETIRED_TRUST_ROOT = "retired-trust-root"
    """The Fulcio CA, CT log or transparency log that vouched for a Sigstore bundle was outside
    its ``validFor`` in the pinned root at the bundle's verified signing time (retired, or not
    yet in service): its keys sign no new signatures, however valid the cryptography."""
    SIGNING_TIME_MISMATCH = "signing-time-mismatch"
    """A keyless statement's ``signed_at`` differs from its verified signing time (the log's or
    the timestamp authority's) by more than the clock skew: the signer misdated it."""
    BAD_BUNDLE = "bad-bundle"
    """Any other check of a Sigstore bundle failed (SCT, key usage, timestamp authority)."""
    CONFIG = "config-error"
    INTERNAL = "internal-error"
    # Refusals at signing time only (issue 49): a plan whose numbers cannot be right, or that
    # was measured by a boot that is not representative, is never signed. The gate's verdicts on
    # a signed plan's bytes are unchanged (``malformed`` for a KV above the baseline).
    KV_NOT_POSITIVE = "kv-not-positive"
    """The plan's ``kv_cache_memory_bytes`` is zero or negative (vLLM #57936's negative value)."""
    KV_ABOVE_DEVICE = "kv-above-device-memory"
    """The plan's KV cache (or its free-memory baseline) exceeds the device's total memory."""
    BASELINE_BELOW_KV = "baseline-below-kv"
    """The free memory the plan was measured with is less than the KV cache it hands out."""
    COLD_COMPILE = "cold-compile"
    """The boot that measured the plan compiled cold (vLLM #54383: ~5 % less KV than warm)."""

    def __str__(self) -> str:  # so f"{reason}" prints the code, not "Reason.X"
        return self.value


class PlanCacheError(Exception):
    """Base of every plancache error: a reason code and a one-line explanation."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:  # picklable, for process pools
        return (_rebuild, (type(self), self.reason, self.detail, getattr(self, "transient", False)))


class Rejected(PlanCacheError):
    """Bytes that failed a check: never used, whatever else is true of them."""


class StoreError(PlanCacheError):
    """Bytes could not be read or written. ``transient``: worth another try in the deadline."""

    def __init__(
        self, detail: str, transient: bool = False, reason: Reason = Reason.STORE_ERROR
    ) -> None:
        super().__init__(reason, detail)
        self.transient = transient


class StoreTimeout(StoreError):
    """The operation's deadline ran out before the store answered."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, transient=False, reason=Reason.TIMEOUT)


class ConfigError(PlanCacheError):
    """The operator's configuration is wrong: a one-line message and exit 2, never a traceback."""

    def __init__(self, detail: str) -> None:
        super().__init__(Reason.CONFIG, detail)


def _rebuild(
    kind: type[PlanCacheError], reason: Reason, detail: str, transient: bool
) -> PlanCacheError:
    """The error :meth:`PlanCacheError.__reduce__` pickled, through its kind's own constructor."""
    if issubclass(kind, (StoreTimeout, ConfigError)):  # these take the detail alone
        return kind(detail)
    if issubclass(kind, StoreError):
        return kind(detail, transient, reason)
    return kind(reason, detail)
