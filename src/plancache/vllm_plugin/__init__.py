"""plancache's vLLM plugin: signed startup plans verified inside the worker, no vLLM changes.

Installed as the ``vllm.general_plugins`` entry point ``plancache``, so vLLM calls
:func:`register` in every process it starts (possibly several times). With
``VLLM_ENABLE_STARTUP_PLAN`` off, :func:`register` returns without importing anything and
vLLM runs exactly as without the plugin. With it on, it replaces vLLM 0.33's
``maybe_apply_startup_plan`` / ``maybe_save_startup_plan`` (in
``vllm.v1.worker.startup_plan``, and in ``vllm.v1.worker.gpu_worker`` when that is already
imported) and wraps ``Worker.load_model`` to prefetch the plan from the store while the
weights load. See :mod:`plancache.vllm_plugin.config` for the environment variables.

This module is imported in every vLLM process: it imports nothing but ``os`` at module level.
"""

import os

__all__ = ["register", "startup_plan_enabled", "unregister"]


def startup_plan_enabled() -> bool:
    """vLLM's switch ``VLLM_ENABLE_STARTUP_PLAN``, read as ``vllm.envs`` reads it
    (``bool(int(value))``, at call time). An unparsable value makes vLLM itself fail loudly;
    the plugin then stays out of the way. Read here at registration without importing vLLM;
    at call time the plugin asks vLLM's own ``envs`` (:func:`.adapter.enabled`)."""
    try:
        return bool(int(os.environ.get("VLLM_ENABLE_STARTUP_PLAN", "0")))
    except ValueError:
        return False


def compile_cache_wanted() -> bool:
    """``PLANCACHE_COMPILE_CACHE`` through the one strict parser (:func:`plancache.settings.
    compile_cache_switch`, which ``doctor`` uses too); imported only when the variable is set,
    so a vLLM process without it pays for nothing. An unknown value is one ERROR line per boot
    (register runs several times; the boot's state, :mod:`.plugin_state`, remembers it) and the
    guard stays on."""
    raw = os.environ.get("PLANCACHE_COMPILE_CACHE")  # settings.COMPILE_CACHE_ENV
    if raw is None:
        return False
    from ..settings import compile_cache_switch

    on, problem = compile_cache_switch(raw)
    if problem:
        from .plugin_state import current

        state = current()
        if not state.switch_reported:
            import logging

            state.switch_reported = True
            logging.getLogger("vllm.plancache").error("plancache: %s", problem)
    return on


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent; never raises."""
    if "PLANCACHE_COMPILE_CACHE" in os.environ or startup_plan_enabled():
        from .log_redaction import install as redact_logs  # no secret in any plugin log line

        redact_logs()
    if compile_cache_wanted():
        from .compile_cache.guard import install  # the compile-cache guard; never raises

        install()
    if not startup_plan_enabled():
        return
    try:
        from . import hooks

        hooks.install()
    except Exception:
        import logging

        logging.getLogger("vllm.plancache").exception(
            "plancache: plugin not installed; vLLM runs unchanged"
        )


def unregister() -> None:
    """Put vLLM's original functions back (tests, or a process that wants plancache out)."""
    import sys

    hooks = sys.modules.get(__name__ + ".hooks")
    if hooks is not None:
        hooks.uninstall()
