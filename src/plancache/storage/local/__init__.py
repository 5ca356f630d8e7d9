"""Local disk: vLLM's plan directory, descriptor-relative files, capped reads and atomic writes,
boot records, and the lock beside a directory that a node's processes share."""
