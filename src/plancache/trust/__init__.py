"""The trust core: the only place where unverified bytes become trusted values.

Everything here is pure: callers hand in bytes and a clock reading, and get back values or a
:class:`~plancache.trust.errors.PlanCacheError` carrying a machine-readable reason.
"""
