"""Type information for the lazily loaded public API (see ``__init__.py``): a stub, so that
``import plancache`` in every vLLM process compiles and runs as little as possible."""

from .api import pull as pull, verify_location as verify_location
from .pipeline.audit import PlanReport as PlanReport
from .pipeline.resolver import Resolver as Resolver
from .pipeline.trust_config import load_trusted_keys as load_trusted_keys, trust_policy as trust_policy
from .storage.local.localdir import LocalPlanDir as LocalPlanDir, default_plan_dir as default_plan_dir
from .storage.store import Store as Store, open_store as open_store
from .trust.errors import (
    ConfigError as ConfigError,
    PlanCacheError as PlanCacheError,
    Reason as Reason,
    Rejected as Rejected,
    StoreError as StoreError,
    StoreTimeout as StoreTimeout,
)
from .trust.plans.gate import Decision as Decision, Verdict as Verdict, decide as decide
from .trust.keyring.keys import Keyring as Keyring
from .trust.policy import TrustPolicy as TrustPolicy
from .trust.result import PlanResult as PlanResult
from .trust.verify import VerifiedPlan as VerifiedPlan, verify_plan as verify_plan

__version__: str
__all__: list[str]
