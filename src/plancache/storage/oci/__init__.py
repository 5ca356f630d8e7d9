"""OCI registries as stores (``oci://HOST[:PORT]/REPOSITORY``): plans and compile caches as
OCI 1.1 artifacts, moved over plain HTTP with plancache's own caps, digests and deadlines."""
