"""The threshold counting one signer twice (issue 48 items 3, 5: every matching line, the most
specific names the signer and counts).

Tried: threshold 2 and two lines for the *same* workflow SAN, one pinned to push and one to
workflow_dispatch (or one bare, one pinned to refs/heads/main); the same workflow runs twice
(two triggers / two refs) and both keyless signatures go into one envelope.
Expected: one workflow identity is one signer: threshold-not-met. (Before the change, two lines
for one SAN could not be written: the second was 'already listed'.)"""
from datetime import timedelta

from harness import NAME, SAN, Env, github, now, plan, report
from plancache.keys.schemes import load_signer
from plancache.trust import envelope as dsse
from plancache.trust.keyless.dsse_extension import as_extension
from plancache.trust.signing import sign_plan

e = Env()
iss = e.stack.issuer
t = now()


def bundle(token: str) -> bytes:
    signer = load_signer("sigstore", {**e.env, "SIGSTORE_ID_TOKEN": token})
    return sign_plan(NAME, plan(), signer, t, expires_at=t + timedelta(days=30))


def both(a: bytes, b: bytes) -> bytes:
    first = as_extension(a)
    entries = [*first.signatures, *as_extension(b).signatures]
    return dsse.encode(dsse.Envelope(first.payload_type, first.payload, tuple(entries)))


push, dispatch = bundle(github(e.stack, event="push")), bundle(github(e.stack, event="workflow_dispatch"))
lines = (f"sigstore issuer={iss} identity={SAN} build-trigger=push\n"
         f"sigstore issuer={iss} identity={SAN} build-trigger=workflow_dispatch\n")
report("threshold 2, lines pinned push / workflow_dispatch, one workflow run twice",
       e.verdict(both(push, dispatch), lines, threshold=2))
main, dev = push, bundle(github(e.stack, ref="refs/heads/dev"))
lines = (f"sigstore issuer={iss} identity={SAN}\n"
         f"sigstore issuer={iss} identity={SAN} source-ref=refs/heads/main\n")
report("threshold 2, a bare line and one pinned to main, the workflow run from main and dev",
       e.verdict(both(main, dev), lines, threshold=2))
lines = (f"sigstore issuer={iss} identity={SAN}\n"
         f"sigstore issuer={iss} identity-regexp=https://github\\.com/acme/.*\n")
report("threshold 2, an exact line and a regexp covering it, one run twice (control)",
       e.verdict(both(main, bundle(github(e.stack))), lines, threshold=2))
e.close()
