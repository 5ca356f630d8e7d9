"""The trust core for startup plans: vLLM's plan format, plan sets, and the free-memory gate."""
