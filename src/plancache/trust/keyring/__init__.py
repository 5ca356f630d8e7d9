"""The keyring: trusted keys, their file formats and encodings, and the signer interface (pure,
no IO)."""
