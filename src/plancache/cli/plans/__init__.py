"""The plan subcommands: keys and signatures (keygen, sign), the offline audit (verify, ls), one
file in detail (inspect), and the store ones (push, pull, prune)."""
