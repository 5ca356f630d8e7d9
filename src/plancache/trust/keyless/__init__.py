"""Keyless signatures: Sigstore bundles verified offline against a pinned trust root
(:mod:`.sigstore_bundle`); the identities they are trusted by live in the keyring
(:mod:`plancache.trust.keyring.identities`)."""
