"""The ``plancache`` command: the three user journeys (CI bake, spot boot, offline audit)."""
