"""The library ring: the flows every caller shares, over storage and the trust core.

``resolver``  local -> verify -> else store -> verify -> persist (pull, the plugin, scripts)
``audit``     verify or list a directory or store URL: one report per plan (verify, ls, prune)
``locations`` a directory or a store URL, opened as a source of raw plan bytes
``signing``   sign (or co-sign) a directory's plans; ``push``/``prune`` bulk store work
``compile_cache``  compile caches: verify, sign, push, pull, publish
``compile_load``   the plugin's guard: pull, verify and copy privately, or quarantine

Nothing here decides trust on its own: every plan becomes trusted only through the
:class:`~plancache.trust.policy.TrustPolicy` a caller passes in.
"""
