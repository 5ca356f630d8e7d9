"""Keyless signatures: Sigstore bundles verified offline against a pinned trust root
(:mod:`.sigstore_bundle`), alone or as DSSE signature extensions beside key signatures in one
envelope (:mod:`.dsse_extension`); the identities they are trusted by live in the keyring
(:mod:`plancache.trust.keyring.identities`)."""
