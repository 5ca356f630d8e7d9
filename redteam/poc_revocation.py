"""Revocation lines that silently revoke nothing, or revoke too much (issue 48 item 5).

The trusted line is the bare SAN (any caller); the operator revokes what runs called from the
fork evil/serving signed, or the branch 'dev', spelling the pin as people do: no scheme, a
trailing slash, '.git', 'dev' for refs/heads/dev, the host in capitals. Then revocations that
should hit (trailing-slash issuer, host case) and one that must not hit more than it says.
Expected: each revocation either revokes the fork's/dev's bundle or is refused at load."""
from harness import SAN, Env, github, report

e = Env()
iss = e.stack.issuer
trusted = f"sigstore issuer={iss} identity={SAN}\n"
fork = e.sign(github(e.stack, "evil/serving"))
dev = e.sign(github(e.stack, ref="refs/heads/dev"))
acme = e.sign(github(e.stack))
rev = lambda pins, i=iss, ident=SAN: trusted + f"@revoked sigstore issuer={i} identity={ident} {pins}\n"  # noqa: E731
for label, line, bundle in [
    ("source-repository=https://github.com/evil/serving (control)", rev("source-repository=https://github.com/evil/serving"), fork),
    ("source-repository=github.com/evil/serving (no scheme)", rev("source-repository=github.com/evil/serving"), fork),
    ("source-repository=https://github.com/evil/serving/ (trailing slash)", rev("source-repository=https://github.com/evil/serving/"), fork),
    ("source-repository=https://github.com/evil/serving.git", rev("source-repository=https://github.com/evil/serving.git"), fork),
    ("source-repository=https://GITHUB.COM/evil/serving (host case)", rev("source-repository=https://GITHUB.COM/evil/serving"), fork),
    ("source-ref=dev (short ref)", rev("source-ref=dev"), dev),
    ("source-ref=refs/heads/dev (control)", rev("source-ref=refs/heads/dev"), dev),
    ("issuer with trailing slash", trusted + f"@revoked sigstore issuer={iss}/ identity={SAN}\n", acme),
    ("identity host in capitals", trusted + f"@revoked sigstore issuer={iss} identity={SAN.replace('github.com', 'GITHUB.COM')}\n", acme),
    ("identity path in capitals (near miss)", trusted + f"@revoked sigstore issuer={iss} identity={SAN.replace('acme', 'ACME')}\n", acme),
    ("revoke the fork: does acme's own bundle stay valid?", rev("source-repository=https://github.com/evil/serving"), acme),
]:
    report(label, e.verdict(bundle, line))
e.close()
