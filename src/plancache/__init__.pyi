"""Type information for the lazily loaded public API (see ``__init__.py``): a stub, so that
``import plancache`` in every vLLM process compiles and runs as little as possible."""

from .api import pull as pull
from .api import verify_location as verify_location
from .pipeline.audit import PlanReport as PlanReport
from .pipeline.resolver import Resolver as Resolver
from .pipeline.trust_config import (
    load_trusted_keys as load_trusted_keys,
)
from .pipeline.trust_config import (
    trust_policy as trust_policy,
)
from .storage.local.localdir import (
    LocalPlanDir as LocalPlanDir,
)
from .storage.local.localdir import (
    default_plan_dir as default_plan_dir,
)
from .storage.store import Store as Store
from .storage.store import open_store as open_store
from .trust.errors import (
    ConfigError as ConfigError,
)
from .trust.errors import (
    PlanCacheError as PlanCacheError,
)
from .trust.errors import (
    Reason as Reason,
)
from .trust.errors import (
    Rejected as Rejected,
)
from .trust.errors import (
    StoreError as StoreError,
)
from .trust.errors import (
    StoreTimeout as StoreTimeout,
)
from .trust.keyring.keys import Keyring as Keyring
from .trust.plans.gate import Decision as Decision
from .trust.plans.gate import Verdict as Verdict
from .trust.plans.gate import decide as decide
from .trust.policy import TrustPolicy as TrustPolicy
from .trust.result import PlanResult as PlanResult
from .trust.verify import VerifiedPlan as VerifiedPlan
from .trust.verify import verify_plan as verify_plan

__version__: str
__all__: list[str]
