"""Amazon S3 and S3-compatible stores: the boot path on plain botocore (:mod:`.direct`, its HTTP
layer bounded by :mod:`.botocore_caps`) and the capped reads and listing pages through s3fs's
client (:mod:`.reads`). Opening s3fs with plancache's defaults is in :mod:`..backends`, its
versioned reads and conditional deletes in :mod:`.s3_versions`."""
