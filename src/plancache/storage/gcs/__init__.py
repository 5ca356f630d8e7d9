"""Google Cloud Storage through gcsfs: its listing page here; its filesystem is opened with
plancache's defaults in :mod:`..backends` and its version-pinned reads and conditional deletes
in :mod:`.gcs_versions`."""
