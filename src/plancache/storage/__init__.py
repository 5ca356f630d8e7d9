"""Storage: moves bytes between plancache and disks or object stores; decides no trust.

Readers return raw bytes, capped in size; writers take bytes that the trust core already
verified (or just signed) and write them so that no reader ever sees half a file.
"""
