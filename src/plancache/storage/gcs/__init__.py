"""Google Cloud Storage through gcsfs (:mod:`.gcs_backend`); its filesystem is opened with
plancache's defaults in :mod:`..backends`."""
