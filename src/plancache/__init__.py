"""plancache: signed, shareable vLLM startup plans.

The package is laid out in three rings, and the folder listing says which is which:

- ``plancache.trust``   -- the trust core. Bytes in, verified values out, one error family.
  It does no IO: no files, no network, no clock of its own (callers pass ``now``).
- ``plancache.storage`` -- moves bytes (vLLM's local plan directory, fsspec stores, key files).
  It never decides whether something is trusted.
- ``plancache.cli`` and ``plancache.vllm_plugin`` -- integrations that wire the two together
  and own the policy knobs (flags, environment variables) and the logging.

Importing ``plancache`` stays cheap on purpose: the vLLM plugin module is imported in every
vLLM process, so nothing here pulls in fsspec, s3fs, torch or vLLM.
"""

__version__ = "0.1.0"
