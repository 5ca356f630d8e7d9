"""The plugin's compile-cache side: the guard before vLLM's reads, torch's private caches,
shipped headers, publish."""
