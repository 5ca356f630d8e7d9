"""Signers whose private key never leaves where CI keeps it: PKCS#11 tokens (HSMs), AWS KMS,
Google Cloud KMS. Each module imports its SDK only when a reference names it, so the core
install (cryptography alone) loads none of them; :func:`plancache.storage.keyfiles.load_signer`
dispatches by the reference's scheme."""
