"""Key custody: where signing keys live and how plancache reaches them, one module per kind of
key reference, chosen by :func:`.schemes.load_signer` from one table (as securesystemslib's
``signer`` package does): private key files (:mod:`.keyfile`, with keygen), ``env://``
(:mod:`.env`), PKCS#11 tokens and HSMs (:mod:`.pkcs11`), AWS KMS (:mod:`.awskms`), Google
Cloud KMS (:mod:`.gcpkms`), the budget and checked signatures every remote kind shares
(:mod:`.remote`), and reading trusted-keys files (:mod:`.trusted_files`).

This room does IO and decides nothing about trust: the keyring, the trusted-keys format and
key encodings are the trust core's (:mod:`plancache.trust.keys`, :mod:`plancache.trust.keyformat`).
"""
