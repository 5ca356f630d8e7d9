"""vLLM's compile cache on disk and in a store: walked, hashed, archived, copied privately,
moved aside.

Moves bytes and decides nothing (the signed manifest decides,
:mod:`plancache.trust.compile_cache.manifest`): :mod:`.cachedir` (a cache directory: walk, hash,
install, quarantine), :mod:`.archive_format` (its archive: written deterministically, extracted
entry by entry), :mod:`.private_copy` (the per-boot private copies vLLM reads, hashed as
written), :mod:`.placement` (a verified archive staged and renamed into place; a lone sidecar and
killed processes' staging cleared away), :mod:`.archives` (a cache's archive and signature
objects in a store), :mod:`.boot_dirs` (where a worker keeps its copies), :mod:`.header_files`
(precompiled headers on disk). The lock a node's ranks share is
:mod:`..local.directory_lock`.
"""
