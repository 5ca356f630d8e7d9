"""Azure Blob Storage through adlfs, bounded like S3 and GCS (:mod:`.blob`): the filesystem,
its capped reads and listing pages. Its versioned reads and conditional deletes are in
:mod:`.azure_versions`."""
