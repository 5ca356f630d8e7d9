"""The CI identity that is almost the trusted one, against source pins (issue 48 item 3).

Tried: a trusted line pinning acme/serving, refs/heads/main, push; tokens from a fork, another
ref, another trigger, a reusable workflow called from elsewhere; a branch whose name differs
from the pinned ref only in case after an '@' (normal_url treats any '@' text as an e-mail
and lowers its 'domain'); a host-case variant of the repository URL.
Expected: only the exact source is valid."""
from harness import SAN, Env, github, report

e = Env()
iss = e.stack.issuer
line = lambda pins: f"sigstore issuer={iss} identity={SAN} {pins}\n"  # noqa: E731
pins = "source-repository=https://github.com/acme/serving source-ref=refs/heads/main build-trigger=push"
cases = {
    "the pinned source": github(e.stack),
    "a fork (evil/serving)": github(e.stack, "evil/serving"),
    "another ref (refs/heads/dev)": github(e.stack, ref="refs/heads/dev"),
    "another trigger (pull_request_target)": github(e.stack, event="pull_request_target"),
}
for label, token in cases.items():
    report(label, e.verdict(e.sign(token), line(pins)))

# '@' in a ref: the pin trusts refs/heads/rel@prod; the attacker pushes rel@PROD
trusted = line("source-repository=https://github.com/acme/serving source-ref=refs/heads/rel@prod")
report("pin source-ref=refs/heads/rel@prod, signed from refs/heads/rel@prod",
       e.verdict(e.sign(github(e.stack, ref="refs/heads/rel@prod")), trusted))
report("pin source-ref=refs/heads/rel@prod, signed from refs/heads/rel@PROD (another branch)",
       e.verdict(e.sign(github(e.stack, ref="refs/heads/rel@PROD")), trusted))
report("pin build-trigger=x@Y? (trigger rel@y vs rel@Y)",
       e.verdict(e.sign(github(e.stack, event="rel@Y")), line("build-trigger=rel@y")))
# host case in a pin
report("pin source-repository=https://GitHub.com/acme/serving (host case)",
       e.verdict(e.sign(github(e.stack)), line("source-repository=https://GitHub.com/acme/serving")))
report("pin source-repository=https://github.com/ACME/serving (path case)",
       e.verdict(e.sign(github(e.stack)), line("source-repository=https://github.com/ACME/serving")))
e.close()
