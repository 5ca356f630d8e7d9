"""Azure Blob Storage through adlfs, bounded like S3 and GCS (:mod:`.blob`): the filesystem,
its capped reads and listing pages. Its conditional deletes are in :mod:`..versioned`."""
