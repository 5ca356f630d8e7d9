"""Azure Blob Storage through adlfs, bounded like S3 and GCS (:mod:`.blob`: the filesystem,
its capped reads and listing pages), as a store's backend (:mod:`.azure_backend`: those, and its
versioned reads and conditional deletes)."""
