"""How plancache gets a registry to answer: the HTTP session, what it sends and the ``401``
challenges it answers (:mod:`.registry_session`), and the credentials a node keeps
(:mod:`.credential_files`).

A folder of its own because these modules share one question, who may be sent what (a secret
only over TLS or to loopback, only to the registry's own host or a realm the operator lists),
and one rule, nothing here blocks the event loop every store shares.
"""
