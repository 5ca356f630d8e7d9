"""What every remote key backend shares: the call budget and the signer they return.

A key in an HSM or a KMS is a network (or driver) call away, and a booting vLLM worker and a
CI job must never hang on it. So every backend call runs on a daemon thread that the caller
waits on for at most the budget (``PLANCACHE_TIMEOUT``, default 3 s, the plugin's own store
budget): past it the caller gets :class:`StoreTimeout` and moves on; the SDK's own timeouts
end the thread later. Failures are one-line :class:`ConfigError` (denied, not found, wrong key
type, unreachable) or :class:`StoreTimeout`; the CLI prints them and exits 2, the plugin logs a
WARNING and saves the plan unsigned.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..settings import TIMEOUT_ENV
from ..storage.deadline import checked_budget
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError, StoreTimeout
from ..trust.keyring.keyformat import key_id

T = TypeVar("T")

ED25519_SIGNATURE_BYTES = 64


def budget_from(env: Mapping[str, str]) -> float:
    """Seconds one backend call may take: ``PLANCACHE_TIMEOUT``, as for store calls."""
    return checked_budget(env.get(TIMEOUT_ENV) or None)


def within(budget: float, what: str, call: Callable[[], T]) -> T:
    """``call()`` on a daemon thread, waited on for at most ``budget`` seconds.

    A daemon thread, not a pool: a backend stuck in a driver or a socket must not keep the
    process from exiting. Exceptions are re-raised as they are (each backend turns its SDK's
    errors into plancache's); only the wait itself becomes :class:`StoreTimeout`.

    Raises:
        StoreTimeout: no answer within ``budget`` (reason ``timeout``).
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="plancache-key", daemon=True).start()
    try:
        return future.result(timeout=budget)
    except concurrent.futures.TimeoutError:
        raise StoreTimeout(f"{what}: no answer within the {budget:g} s budget") from None


@dataclass(frozen=True)
class RemoteSigner:
    """A :class:`~plancache.trust.keyring.keys.Signer` whose private half stays in an HSM or a KMS.

    ``source`` names the key in messages, without secrets (a PKCS#11 PIN is never shown).
    Each signature is checked against the public key read at load time before it is
    returned: the backend is another party, and a wrong key or a garbled answer must fail
    here, not in every verifier downstream.
    """

    source: str
    public: Ed25519PublicKey
    raw_sign: Callable[[bytes], object] = field(repr=False)
    """The backend's own call: what it returns is the other party's, checked by :meth:`sign`."""
    budget: float

    @property
    def keyid(self) -> str:
        return key_id(self.public)

    def sign(self, data: bytes) -> bytes:
        """The backend's Ed25519 signature over ``data``, checked with the public key.

        Raises:
            ConfigError: the backend refused, or returned no 64-byte signature, or one its own
                public key does not verify (reason ``config-error``).
            StoreTimeout: no answer within the budget (reason ``timeout``).
        """
        signature = within(self.budget, f"signing with {self.source}", lambda: self.raw_sign(data))
        if not isinstance(signature, bytes) or len(signature) != ED25519_SIGNATURE_BYTES:
            raise ConfigError(f"{self.source} returned no 64-byte Ed25519 signature")
        try:
            self.public.verify(signature, data)
        except InvalidSignature:
            raise ConfigError(
                f"{self.source} returned a signature that its own public key does not verify"
            ) from None
        return signature


def missing_extra(scheme: str, module: str, extra: str) -> ConfigError:
    return ConfigError(f"{scheme} key references need {module}: pip install 'plancache[{extra}]'")


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An SDK error as one short, safe line."""
    if isinstance(exc, PlanCacheError):
        return exc.detail
    return safe_text(" ".join(str(exc).split()) or type(exc).__name__, limit)
