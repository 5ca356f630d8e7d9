"""plancache: signed, shareable vLLM startup plans.

The package is laid out in rings, and the folder listing says which is which:

- ``plancache.trust``    the trust core. Bytes in, verified values out, errors in kinds, the
  policy and the gate. It does no IO: no files, no network, no clock of its own.
- ``plancache.storage``  moves bytes (vLLM's plan directory, fsspec stores: one subpackage per
  backend) within caps and deadlines. It never decides whether something is trusted.
- ``plancache.keys``     key custody: key files, ``env://``, HSMs and KMS, chosen by reference;
  like storage, it does IO and decides no trust.
- ``plancache.pipeline`` the flows every caller shares: the resolver (local -> verify -> else
  store -> verify -> persist), audits of a directory or URL, signing, push and prune.
- ``plancache.cli`` and ``plancache.vllm_plugin`` integrations: they read flags or the
  environment, build one policy, call the pipeline and render or log the outcome.

The names below form the public Python API for scripts (see docs/python-api.md). They are
loaded lazily: the vLLM plugin imports this package in every vLLM process, so ``import
plancache`` pulls in none of fsspec, s3fs, gcsfs, aiobotocore, torch or vLLM.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "verify_location": "plancache.api",
    "pull": "plancache.api",
    "load_trusted_keys": "plancache.pipeline.trust_config",
    "trust_policy": "plancache.pipeline.trust_config",
    "open_store": "plancache.storage.store",
    "Store": "plancache.storage.store",
    "LocalPlanDir": "plancache.storage.local.localdir",
    "default_plan_dir": "plancache.storage.local.localdir",
    "Resolver": "plancache.pipeline.resolver",
    "PlanReport": "plancache.pipeline.audit",
    "verify_plan": "plancache.trust.verify",
    "VerifiedPlan": "plancache.trust.verify",
    "Keyring": "plancache.trust.keyring.keys",
    "TrustPolicy": "plancache.trust.policy",
    "PlanResult": "plancache.trust.result",
    "Decision": "plancache.trust.plans.gate",
    "Verdict": "plancache.trust.plans.gate",
    "decide": "plancache.trust.plans.gate",
    "Reason": "plancache.trust.errors",
    "PlanCacheError": "plancache.trust.errors",
    "Rejected": "plancache.trust.errors",
    "StoreError": "plancache.trust.errors",
    "StoreTimeout": "plancache.trust.errors",
    "ConfigError": "plancache.trust.errors",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - one list of the names: _EXPORTS' keys, loaded lazily
"""(Their types are in ``__init__.pyi``: a stub costs the many processes that import this
package nothing.)"""


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'plancache' has no attribute {name!r}")
    value = getattr(__import__(module, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
