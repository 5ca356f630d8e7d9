"""Compile-cache flows: sign, verify, push, pull and publish; the plugin's load; shipped headers."""
