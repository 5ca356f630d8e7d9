"""The keyless bake jobs of docs/keys.md, run as the page writes them (issue 37 items 1, 5).

Each job's YAML is read from the page: the GitHub Actions job takes its token from the runner's
token endpoint (``ACTIONS_ID_TOKEN_REQUEST_URL``, served here on loopback), the GitLab job the
``SIGSTORE_ID_TOKEN`` its ``id_tokens`` export; both run ``plancache-ci-bake`` with the page's
variables through the local Fulcio and Rekor of tests/sigstore_stack.py (a private instance, so
the jobs get its trust config and root, as the page says), and the plans they leave for the
image verify under the line the page tells nodes to trust (its issuer the stack's).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_support import run
from conftest import FP, GIB, plan_bytes
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name, sig_name
from sigstore_stack import SigstoreStack

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "keys.md"
BAKE = ROOT / "src" / "plancache" / "journeys" / "ci-bake.sh"
FP2 = "fedcba9876543210"
RUNNER_SECRET = "runner-request-token"


def documented_jobs() -> dict[str, dict[str, Any]]:
    """The page's YAML blocks: GitHub's (``jobs: bake:``) and GitLab's (``bake:``)."""
    jobs: dict[str, dict[str, Any]] = {}
    for block in re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), flags=re.S | re.M):
        doc = yaml.safe_load(block)
        if "jobs" in doc:
            jobs["github"] = doc["jobs"]["bake"]
        elif "bake" in doc:
            jobs["gitlab"] = doc["bake"]
    return jobs


def node_lines() -> dict[str, str]:
    """The ``Nodes trust `sigstore …``` line after each job, by issuer."""
    found = re.findall(r"Nodes trust `(sigstore issuer=[^`]+)`", DOC.read_text())
    lines = [" ".join(text.split()) for text in found]
    return {"github" if "githubusercontent" in line else "gitlab": line for line in lines}


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack() as s:
        yield s


class TokenEndpoint:
    """GitHub's runner token service, as ``id`` (sigstore-python's detector) asks it: a GET with
    the runner's bearer token and ``audience=sigstore``, answered with ``{"value": JWT}``."""

    def __init__(self, token: str) -> None:
        self.requests: list[tuple[str, str]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                auth = self.headers.get("Authorization", "")
                endpoint.requests.append((self.path, auth))
                ok = auth == f"bearer {RUNNER_SECRET}" and "audience=sigstore" in self.path
                body = json.dumps({"value": token} if ok else {"message": "no"}).encode()
                self.send_response(200 if ok else 403)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token?api-version=2.0"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def bake_env(job: dict[str, Any], kind: str, tmp_path: Path) -> dict[str, str]:
    """What the job's bake step sees: the page's variables (the store a directory here)."""
    if kind == "github":
        assert job["permissions"]["id-token"] == "write"
        (step,) = [s for s in job["steps"] if s.get("run") == "plancache-ci-bake"]
        variables = {**job.get("env", {}), **step.get("env", {})}
    else:
        assert job["id_tokens"]["SIGSTORE_ID_TOKEN"]["aud"] == "sigstore"
        assert "plancache-ci-bake" in job["script"]
        variables = dict(job["variables"])
    assert variables["PLANCACHE_SIGNING_KEY"] == "sigstore"
    assert variables["PLANCACHE_URL"].startswith("s3://")
    variables["PLANCACHE_URL"] = (tmp_path / "store").as_uri()
    return {k: str(v) for k, v in variables.items()}


@pytest.mark.parametrize("kind", ["github", "gitlab"])
def test_the_documented_job_bakes_keylessly(
    capsys: pytest.CaptureFixture[str],
    stack: SigstoreStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    job = documented_jobs()[kind]
    (tmp_path / "store").mkdir()
    (tmp_path / "trust_config.json").write_bytes(stack.trust_config_bytes())
    (tmp_path / "trusted_root.json").write_bytes(stack.trusted_root_bytes())
    profiled = LocalPlanDir(tmp_path / "vllm" / "startup_plan")  # what the profiling step left
    profiled.write(FP, plan_bytes(), None)
    profiled.write(FP2, plan_bytes(fp=FP2, kv=GIB, baseline=2 * GIB), None)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "SIGSTORE_", "GITHUB_", "GITLAB_", "ACTIONS_"))
    }
    env.update(
        PYTHONPATH=str(ROOT / "src"),
        PLANCACHE=f"{sys.executable} -m plancache.cli.main",
        VLLM_CACHE_ROOT=str(tmp_path / "vllm"),
        PLANCACHE_SIGSTORE_TRUST_CONFIG=str(tmp_path / "trust_config.json"),
        PLANCACHE_SIGSTORE_TRUSTED_ROOT=str(tmp_path / "trusted_root.json"),
        **bake_env(job, kind, tmp_path),
    )
    endpoint = None
    if kind == "github":  # Fulcio certifies the workflow (job_workflow_ref), not the sub
        token = stack.token(
            "repo:acme/serving:ref:refs/heads/main",
            job_workflow_ref="acme/serving/.github/workflows/bake.yml@refs/heads/main",
        )
        endpoint = TokenEndpoint(token)
        env.update(
            GITHUB_ACTIONS="true",
            ACTIONS_ID_TOKEN_REQUEST_URL=endpoint.url,
            ACTIONS_ID_TOKEN_REQUEST_TOKEN=RUNNER_SECRET,
        )
    else:  # the stack certifies the sub: GitLab's SAN, as Fulcio makes it from ci_config_ref_uri
        token = stack.token("https://gitlab.com/acme/serving//.gitlab-ci.yml@refs/heads/main")
        env.update(GITLAB_CI="true", SIGSTORE_ID_TOKEN=token)
    try:
        done = subprocess.run(
            ["bash", str(BAKE)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
    finally:
        if endpoint is not None:
            endpoint.close()
    assert done.returncode == 0, done.stdout + done.stderr
    for secret in (token, RUNNER_SECRET):
        assert secret not in done.stdout + done.stderr
    if endpoint is not None:
        assert endpoint.requests and all(
            a == f"bearer {RUNNER_SECRET}" for _, a in endpoint.requests
        )
    image = tmp_path / env["IMAGE_PLAN_DIR"]
    assert sorted(p.name for p in image.iterdir()) == sorted(
        [plan_name(FP), sig_name(FP), plan_name(FP2), sig_name(FP2)]
    )
    line = node_lines()[kind]
    issuer = (
        "https://token.actions.githubusercontent.com" if kind == "github" else "https://gitlab.com"
    )
    (tmp_path / "nodes").write_text(line.replace(f"issuer={issuer} ", f"issuer={stack.issuer} "))
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(tmp_path / "trusted_root.json"))
    code, out, err = run(
        capsys, "verify", "--trusted-keys", str(tmp_path / "nodes"), "--json", str(image)
    )
    report = json.loads(out)
    assert code == 0 and report["ok"], out + err
    identity = line.split("identity=")[1]
    assert {p["signed_by"][0]["identity"] for p in report["plans"]} == {identity}
