"""PoC 5: the plugin's boot line names a mirror its plan was not read through.

Tried: in one process (as in a vLLM worker with the plugin), a read through a registry's mirror
by one store (the compile cache's store, say, `oci://127.0.0.1:P/team/cache` with a mirror)
then the plan read from another store without a mirror (`oci://127.0.0.1:Q/team/plans`). The
plugin's boot line (`log_decision(..., "store", ...)`) names `via_mirror=` from a process-wide
list that nothing in the plugin ever clears.
Happened: the plan's line says `via_mirror=127.0.0.2:…` though the plan came from the registry
itself; and the compile-cache decision line (decisions.log) names no mirror at all although its
bytes came through one.
Run: PYTHONPATH=src:tests python redteam/poc_via_mirror_attribution.py
"""

from __future__ import annotations

import logging
import os

from registry_stub import RegistryStub

from plancache.storage.store import open_store
from plancache.trust.plans.gate import Decision, Verdict
from plancache.vllm_plugin.boot import log_decision

os.environ["DOCKER_CONFIG"] = "/nonexistent"
cache_registry, mirror, plans_registry = RegistryStub(), RegistryStub(address="127.0.0.2"), RegistryStub()
FP = "0123456789abcdef"
open_store(cache_registry.url("team/cache"), {"mirror": f"http://{mirror.host}"}, timeout=10).fetch(FP)
open_store(plans_registry.url("team/plans"), {"mirror_config": "none"}, timeout=10).fetch(FP)
lines: list[str] = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        lines.append(record.getMessage())


logger = logging.getLogger("vllm.plancache")
logger.addHandler(Keep())
logger.setLevel(logging.INFO)
try:  # the plugin's own call passes its boot (6a1747b's log_decision takes none)
    from plancache.trust.policy import TrustPolicy
    from plancache.vllm_plugin.config import PluginConfig
    from plancache.vllm_plugin.worker_boot import Boot

    boot = Boot(PluginConfig(url=plans_registry.url("team/plans")), TrustPolicy.unsigned_local())
    log_decision(Decision(True, Verdict.APPLIED, "", 1, FP), "store", FP, 0.0, boot=boot)
except TypeError:
    log_decision(Decision(True, Verdict.APPLIED, "", 1, FP), "store", FP, 0.0)
print(lines[-1])
print("plan store's registry requests:", len(plans_registry.state.requests), "mirror's:", len(mirror.state.requests))
