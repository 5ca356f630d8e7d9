"""The plan subcommands: the local ones (keygen, sign, verify, ls, inspect) and the store ones (push, pull, prune)."""
