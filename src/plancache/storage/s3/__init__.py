"""Amazon S3 and S3-compatible stores: the store's backend (:mod:`.s3_backend`: capped reads and
listing pages through s3fs's client, :mod:`.reads`; versioned reads and conditional deletes),
and the boot path on plain botocore before s3fs is needed (:mod:`.direct`, its HTTP layer
bounded by :mod:`.botocore_caps`). Opening s3fs with plancache's defaults is in
:mod:`..backends`."""
