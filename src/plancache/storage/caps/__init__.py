"""Caps on every body a store sends: the numbers and checks every path shares
(:mod:`.bodies`, also the plain-botocore boot path, which must not import aiohttp), and the
aiohttp hooks that hold them inside the SDKs (:mod:`.http`)."""
