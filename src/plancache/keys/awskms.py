"""``awskms://`` key references: an AWS KMS key of spec ``ECC_NIST_EDWARDS25519`` signing through
boto3 (extra ``[awskms]``), in cosign's forms::

    awskms:///1234abcd-12ab-34cd-56ef-1234567890ab      key id (region from the SDK's settings)
    awskms:///alias/plancache-ci                         alias
    awskms:///arn:aws:kms:eu-west-1:111122223333:key/…   ARN (its region is used)
    awskms://kms.internal:4443/alias/plancache-ci        an endpoint (https://HOST:PORT)

KMS signs Ed25519 natively over the message itself (``SigningAlgorithm=ED25519_SHA_512``,
``MessageType=RAW``, at most 4096 bytes, which the trust core's statement cap guarantees);
the public key comes from ``GetPublicKey`` as a DER SubjectPublicKeyInfo. Credentials,
region and ``AWS_ENDPOINT_URL_KMS`` come from boto3's own settings, as for the aws CLI.
Each call is bounded twice: botocore's connect/read timeouts and at most two attempts, and
the budget thread around it (:func:`~.remote_signer.within`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol, TypedDict, TypeVar

from ..trust.display import safe_text
from ..trust.errors import ConfigError, StoreTimeout
from ..trust.keyring.keyformat import parse_der_public
from .remote_signer import RemoteSigner, missing_extra, one_line, within

SCHEME = "awskms://"
KEY_SPEC = "ECC_NIST_EDWARDS25519"
ALGORITHM = "ED25519_SHA_512"
_ARN_REGION = re.compile(r"arn:aws[a-z-]*:kms:([a-z0-9-]+):")
_KEY = re.compile(r"[A-Za-z0-9:/_.+=,@-]{1,2048}")
T = TypeVar("T")


class _PublicKeyAnswer(TypedDict, total=False):
    """What plancache reads of ``GetPublicKey``'s answer (botocore parses it by the KMS model)."""

    KeySpec: str
    KeyUsage: str
    SigningAlgorithms: list[str]
    PublicKey: bytes


class _SignAnswer(TypedDict, total=False):
    Signature: bytes


class _KmsClient(Protocol):
    """The two calls of boto3's KMS client plancache makes (boto3 ships no types)."""

    def get_public_key(self, *, KeyId: str) -> _PublicKeyAnswer: ...

    def sign(
        self, *, KeyId: str, Message: bytes, MessageType: str, SigningAlgorithm: str
    ) -> _SignAnswer: ...


def parse_awskms_uri(ref: str) -> tuple[str | None, str]:
    """(endpoint host[:port] or None, key id / alias / ARN).

    Raises:
        ConfigError: not one of the forms in the module docstring (reason ``config-error``).
    """
    rest = ref[len(SCHEME) :] if ref.startswith(SCHEME) else ""
    host, _, key = rest.partition("/")
    if not _KEY.fullmatch(key) or (
        host
        and not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9a-fA-F:]+\](:[0-9]{1,5})?", host)
    ):
        raise ConfigError(
            f"'{safe_text(ref, 80)}' is not awskms:///KEY-ID, awskms:///alias/NAME, "
            "awskms:///arn:… or awskms://HOST:PORT/KEY"
        )
    return host or None, key


def _client(endpoint: str | None, key: str, budget: float) -> _KmsClient:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import NoRegionError
    except ImportError:
        raise missing_extra("awskms://", "boto3", "awskms") from None
    arn_region = _ARN_REGION.match(key)
    config = Config(
        connect_timeout=budget,
        read_timeout=budget,
        retries={"mode": "standard", "total_max_attempts": 2},
    )
    try:
        client: _KmsClient = boto3.session.Session().client(
            "kms",
            region_name=arn_region.group(1) if arn_region else None,
            endpoint_url=f"https://{endpoint}" if endpoint else None,
            config=config,
        )
    except NoRegionError:
        raise ConfigError(
            f"{SCHEME}: no AWS region: set AWS_REGION, or name the key by its ARN"
        ) from None
    return client


def _call(source: str, what: str, call: Callable[[], T]) -> T:
    """One KMS call with botocore's failures as plancache's: denied, missing, disabled keys and
    unreachable endpoints are ConfigError; the SDK's own timeouts are StoreTimeout."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    try:
        return call()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "error"), error.get("Message", "")
        raise ConfigError(
            f"{source}: AWS KMS refused {what}: {safe_text(code, 60)}: {safe_text(message, 160)}"
        ) from None
    except (ConnectTimeoutError, ReadTimeoutError) as exc:
        raise StoreTimeout(f"{source}: AWS KMS {what}: {one_line(exc)}") from None
    except NoCredentialsError:
        raise ConfigError(
            f"{source}: no AWS credentials (environment, profile or instance role)"
        ) from None
    except BotoCoreError as exc:
        raise ConfigError(f"{source}: AWS KMS {what} failed: {one_line(exc)}") from None


def awskms_signer(ref: str, budget: float) -> RemoteSigner:
    """Check the key's spec and read its public key (``GetPublicKey``), within ``budget``.

    Raises:
        ConfigError: a malformed reference, no region or credentials, a refusal, a key that is
            not an ``ECC_NIST_EDWARDS25519`` SIGN_VERIFY key offering Ed25519, an unreadable
            public key, boto3 not installed (reason ``config-error``).
        StoreTimeout: KMS did not answer within ``budget`` (reason ``timeout``).
    """
    endpoint, key = parse_awskms_uri(ref)
    source = safe_text(ref, 120)

    def load() -> tuple[_KmsClient, _PublicKeyAnswer]:
        client = _client(endpoint, key, budget)
        return client, _call(source, "GetPublicKey", lambda: client.get_public_key(KeyId=key))

    client, answer = within(budget, f"reading the public key of {source}", load)
    if answer.get("KeySpec") != KEY_SPEC or answer.get("KeyUsage") != "SIGN_VERIFY":
        raise ConfigError(
            f"{source}: the key is {safe_text(answer.get('KeySpec'), 40)}/"
            f"{safe_text(answer.get('KeyUsage'), 20)}, not a {KEY_SPEC} SIGN_VERIFY key"
        )
    if ALGORITHM not in (answer.get("SigningAlgorithms") or []):
        raise ConfigError(f"{source}: the key does not offer {ALGORITHM}")
    try:
        public = parse_der_public(answer.get("PublicKey") or b"")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.detail}") from None

    def raw_sign(data: bytes) -> bytes | None:
        reply = _call(
            source,
            "Sign",
            lambda: client.sign(
                KeyId=key, Message=data, MessageType="RAW", SigningAlgorithm=ALGORITHM
            ),
        )
        return reply.get("Signature")  # RemoteSigner.sign checks what KMS returned

    return RemoteSigner(source, public, raw_sign, budget)
