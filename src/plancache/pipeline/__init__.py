"""The library ring: the flows every caller shares, over storage and the trust core.

``resolver``  local -> verify -> else store -> verify -> persist (pull, the plugin, scripts)
``audit``     verify or list a directory or store URL: one report per plan (verify, ls, prune)
``locations`` a directory or a store URL, opened as a source of raw plan bytes
``directory_signing``  sign (or co-sign) a directory's plans; ``bulk`` push; ``pruning`` prune
``explain``   why a node would miss, against what a store or directory holds, verified
``plan_sets``      plan sets: signed at push, audited, read once per node at boot
``compile_cache``  compile caches: the local reads (verify, ls), the manifests signed, the
                   flows that write (sign, publish, push, pull), the plugin's load (pull,
                   verify and copy privately, or quarantine), shipped headers

Nothing here decides trust on its own: every plan becomes trusted only through the
:class:`~plancache.trust.policy.TrustPolicy` a caller passes in.
"""
