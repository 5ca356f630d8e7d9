"""sigstore-python's refusals of a bundle, as plancache's reasons.

The verifier (:meth:`sigstore.verify.Verifier.verify_dsse`) says why it refuses in an exception's
type and text, in the order it checks (a trusted time, the chain at that time, the SCT, the
identity policy, the log proof and its signed entry timestamp, the time inside the certificate,
the signature, the log entry against the envelope). Mapped here, for the pinned version, to the
distinct reasons of issue 37 item 3. Apart from :mod:`.sigstore_bundle` (what plancache accepts
and in which order) because this part follows sigstore-python's wording, and changes with it.

One subtlety of that order: the certificate chain is checked at the log's time *before* the log
proof that vouches for the time. A bundle whose ``integratedTime`` was altered fails the chain
first; it is ``certificate-outside-validity`` only if its log entry then verifies (the log
itself said so), else ``bad-log-proof`` (the time is nobody's word).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..display import safe_text
from ..errors import Reason, Rejected

if TYPE_CHECKING:
    from sigstore.models import Bundle
    from sigstore.verify import Verifier

_OUTSIDE = "the signing certificate was not valid at the logged time"


def logged_time(bundle: Bundle) -> datetime | None:
    """When the log (Rekor v1's integrated time) or else a TSA (Rekor v2) says it was signed."""
    entry = bundle.log_entry._inner
    if entry.integrated_time:
        return datetime.fromtimestamp(entry.integrated_time, timezone.utc)
    data = bundle.verification_material.timestamp_verification_data
    stamps = data.rfc3161_timestamps if data is not None else []
    return stamps[0].tst_info.gen_time if stamps else None


def refusal(exc: Exception, verifier: Verifier, bundle: Bundle) -> Rejected:
    """The reason for one refusal of ``verify_dsse`` (anything it raised, as raised)."""
    from sigstore.errors import CertValidationError

    if isinstance(exc, CertValidationError):
        if _outside_validity(bundle):
            if _log_proof_holds(verifier, bundle):
                return Rejected(Reason.CERT_OUTSIDE_VALIDITY, _OUTSIDE)
            return Rejected(
                Reason.BAD_LOG_PROOF,
                "the log time is outside the certificate, and the log entry stating it does not "
                "verify (an altered time?)",
            )
        return Rejected(
            Reason.FOREIGN_TRUST_ROOT,
            f"the certificate does not chain to the pinned trust root ({safe_text(str(exc), 120)})",
        )
    return Rejected(*_classify(str(exc)))


def _log_proof_holds(verifier: Verifier, bundle: Bundle) -> bool:
    """Whether the log entry (inclusion proof, checkpoint, signed entry timestamp) verifies
    under the root's log keys, as the verifier would check it next."""
    from sigstore._internal.trust import KeyringPurpose

    try:
        bundle.log_entry._verify(verifier._trusted_root.rekor_keyring(KeyringPurpose.VERIFY))
    except Exception:  # any refusal: the time is not the log's word
        return False
    return True


def _outside_validity(bundle: Bundle) -> bool:
    cert = bundle.signing_certificate
    try:
        moment = logged_time(bundle)
    except (OverflowError, OSError, ValueError):
        return False
    if moment is None:
        return False
    return bool(moment < cert.not_valid_before_utc or moment > cert.not_valid_after_utc)


def _classify(message: str) -> tuple[Reason, str]:
    """sigstore-python's ``VerificationError`` texts (pinned version) to reasons."""
    text = safe_text(message, 200)
    if message.startswith("invalid log entry") or "log entry" in message:
        return Reason.BAD_LOG_PROOF, f"the transparency-log proof does not verify: {text}"
    if "expired at time of signing" in message:
        return Reason.CERT_OUTSIDE_VALIDITY, _OUTSIDE
    if message.startswith("DSSE: invalid signature"):
        return (
            Reason.BAD_SIGNATURE,
            "the bundle's DSSE signature does not verify (altered payload?)",
        )
    if "verified time" in message:  # its timestamps verify under no authority of the root
        return Reason.FOREIGN_TRUST_ROOT, f"no timestamp the pinned root trusts: {text}"
    return Reason.BAD_BUNDLE, f"the Sigstore bundle does not verify: {text}"
