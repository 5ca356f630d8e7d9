"""Catastrophic backtracking with a hostile SAN: is there a length cap or a timeout?

Tried, each in a subprocess with a 20 s limit, on the matcher the verifier runs
(identity_match.trusted_lines; the old code: line.matches + matches_unanchored), with SANs an
attacker can get certified under the same issuer (their own repository, a long branch name):
a fragment-style expression (.*acme/serving.*@refs/tags/v.*) at 1k-8k characters, and a nested
repetition ((/.*)*) at 200 characters. Expected: bounded time, or the line refused at load."""
import subprocess
import sys

from harness import CODE

CHILD = r'''
import sys, time
from plancache.trust.errors import PlanCacheError
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
rx, n = sys.argv[1], int(sys.argv[2])
iss = "https://token.actions.githubusercontent.com"
san = "https://github.com/evil/x/.github/workflows/a.yml@refs/heads/" + ("acme/serving/" * n)[:n]
try:
    lines = parse_trusted_keys(f"sigstore issuer={iss} identity-regexp={rx}\n", "t").identities.trusted
except PlanCacheError as exc:
    print("refused at load:", exc.detail[:90]); sys.exit()
t = time.perf_counter()
try:
    from plancache.trust.keyring.identity_match import CertifiedIdentity, trusted_lines
    try:
        trusted_lines(lines, CertifiedIdentity(iss, (san,)))
        out = "matched"
    except Exception as exc:
        out = exc.reason.value
except ImportError:
    out = str([l.matches(san) or l.matches_unanchored(san) for l in lines])
print(f"{out} in {time.perf_counter() - t:.2f}s")
'''
for rx, n in [(r".*acme/serving.*@refs/tags/v.*", 1000), (r".*acme/serving.*@refs/tags/v.*", 4000),
              (r".*acme/serving.*@refs/tags/v.*", 8000),
              (r"https://github\.com/(acme|[a-z-]+)/.*(/.*)*@refs/heads/main", 200)]:
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, rx, str(n)], capture_output=True, text=True, timeout=20)
        out = (r.stdout or r.stderr).strip().splitlines()[-1]
    except subprocess.TimeoutExpired:
        out = "still running after 20 s (killed)"
    print(f"[{CODE}] {rx} vs a {n}-character branch name: {out}")
