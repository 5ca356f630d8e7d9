"""Key custody: where signing keys live and how plancache reaches them, one module per kind of
key reference, chosen by :func:`.schemes.load_signer` from one table (as securesystemslib's
``signer`` package does): key files (:mod:`.keyfile`: private keys, keygen, and reading
trusted-keys files), ``env://`` (:mod:`.env`), PKCS#11 tokens and HSMs (:mod:`.pkcs11`, their
references :mod:`.pkcs11_uri`), AWS KMS (:mod:`.awskms`), Google Cloud KMS (:mod:`.gcpkms`),
and the budget and checked signatures every remote kind shares (:mod:`.remote_signer`).

This room does IO and decides nothing about trust: the keyring, the trusted-keys format and
key encodings are the trust core's (:mod:`plancache.trust.keyring.keys`,
:mod:`plancache.trust.keyring.trusted_keys_file`, :mod:`plancache.trust.keyring.keyformat`).
"""
