"""Compile caches in the flows: verify and list (local_caches), what is signed
(manifest_building), sign, publish, push and pull (flows), the plugin's load, shipped headers."""
