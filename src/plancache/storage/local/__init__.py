"""Local disk: vLLM's plan directory, descriptor-relative files, capped reads and atomic writes, boot records."""
