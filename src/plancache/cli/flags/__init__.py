"""The ``plancache`` command's flags, by family of commands (:mod:`plancache.cli.commands`)."""
