"""The subcommands that explain a node: ``doctor``, ``explain``, ``fingerprint`` and the
node_exporter textfile."""
