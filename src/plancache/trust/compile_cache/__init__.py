"""The trust core for compile caches: a cache directory's signed manifest and its shipped
precompiled headers."""
