"""Rank-consistent admission with real processes: gloo worlds through vLLM's own distributed init.

Two worlds are started once for the module, in parallel: 2 ranks (TP=2) and 4 ranks (TP=2 x
PP=2). Each rank is a process running tests/vllm_rank.py, forked from one zygote that imported
vLLM's modules and ran nothing (tests/compile_zygote.py: six interpreters importing vLLM were most
of the fixture's time; ``RANKS_FRESH=1`` starts fresh ones):
vLLM's ``init_distributed_environment`` + ``ensure_model_parallel_initialized`` inside
``set_current_vllm_config``, the plugin loaded as a worker loads it, and per boot the real
``Worker.determine_available_memory`` on a Worker stand-in with that rank. The profiling path
runs a real world-group collective (as ``profile_cudagraph_memory`` does on a GPU), so a world
whose ranks disagreed would show it: the profiling ranks' collective would time out.

This parent process never imports vLLM: it writes plans for the fingerprints the ranks report.
The tests that kill a rank come last: a world is not usable after that.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from compile_zygote import Forked, Zygote
from late_ports import late_port
from plancache.keys.keyfile import generate_keypair
from plancache.storage.deadline import JOIN_GRACE
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.signing import sign_plan
from plancache.vllm_plugin.vote import MARGIN_S
from realtime import SLACK_S
from store_servers import (
    AWS_ENV,
    BlackHole,
    MotoServer,
    black_hole,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)
from vllm_cpu import DEVICE_TOTAL, GIB, PLANNED_KV, UTIL, conditions, cpu_environ, write_tiny_model
from vllm_rank import PRELOAD

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
WORLDS = {"tp2": (2, 1), "tp2xpp2": (2, 2)}
PROFILED = int(DEVICE_TOTAL * UTIL) - 3 * GIB
"""What a profiled boot returns with the rank driver's fake profiler."""


class World:
    """The processes of one world, and a connection to each rank."""

    def __init__(
        self,
        name: str,
        tp: int,
        pp: int,
        model: Path,
        logs: Path,
        env: dict[str, str],
        zygote: Zygote | None,
    ) -> None:
        self.name, self.size = name, tp * pp
        authkey = secrets.token_bytes(16)
        # Every rank connects at once, while the test may still be accepting another world: with
        # multiprocessing's backlog of 1 the kernel drops the extra SYNs and a rank's connect
        # times out (~2 min) on a loaded machine.
        self.listener = Listener(("127.0.0.1", 0), authkey=authkey, backlog=self.size)
        port = late_port()  # rank 0's TCPStore binds it minutes from now (tests/late_ports.py)
        self.procs: dict[int, subprocess.Popen[bytes] | Forked] = {}
        script = str(HERE / "vllm_rank.py")
        for rank in range(self.size):
            log = logs / f"{name}-rank{rank}.log"
            argv = [
                f"{self.listener.address[0]}:{self.listener.address[1]}",
                authkey.hex(),
                str(rank),
                str(tp),
                str(pp),
                str(port),
                str(model),
            ]
            if zygote is not None:
                self.procs[rank] = zygote.start(
                    argv, env, os.getcwd(), str(log), str(log), script=script
                )
            else:
                with open(log, "wb") as out:
                    self.procs[rank] = subprocess.Popen(
                        [sys.executable, script, *argv],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
        self.conns: dict[int, Connection] = {}
        self.info: dict[int, dict[str, Any]] = {}

    # A start-up wait, not a budget: 300 s ran out beside the other vLLM fixtures (xdist, load 7-9).
    def accept(self, timeout: float = 900.0) -> None:
        # ranks connect before importing vLLM
        pending = [self.listener.accept() for _ in range(self.size)]
        end = time.monotonic() + timeout
        for conn in pending:
            if not conn.poll(max(0.0, end - time.monotonic())):
                raise RuntimeError(f"{self.name}: a rank did not come up in {timeout} s")
            hello = conn.recv()
            assert "error" not in hello, hello["error"]
            self.conns[hello["rank"]] = conn
            self.info[hello["rank"]] = hello

    def fingerprint(self, rank: int) -> str:
        return str(self.info[rank]["fingerprint"])

    def boot(
        self, cmds: dict[int, dict[str, Any]], timeout: float = 60.0
    ) -> dict[int, dict[str, Any]]:
        """Send every rank its boot at once; the outcomes by rank."""
        for rank, cmd in cmds.items():
            self.conns[rank].send({"op": "boot", **cmd})
        out = {}
        for rank in cmds:
            assert self.conns[rank].poll(timeout), (
                f"{self.name} rank {rank} gave no answer in {timeout} s"
            )
            out[rank] = self.conns[rank].recv()
            assert "error" not in out[rank], out[rank]["error"]
        print(
            f" [{self.name}: plugin held "
            + " ".join(f"{held(o):.2f}" for o in out.values())
            + " s]",
            end="",
        )
        return out

    def close(self) -> None:
        """Every rank ends at once ("quit"): nothing is asserted after this, and a rank's orderly
        interpreter exit (gloo's and vLLM's shutdown) took 2.5-5 s of the module's teardown."""
        for conn in self.conns.values():
            try:
                conn.send({"op": "quit"})
            except OSError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.listener.close()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, World]]:
    root = tmp_path_factory.mktemp("ranks")
    model = root / "tiny-llama"
    write_tiny_model(model)
    env = {**os.environ, **cpu_environ(root / "cache"), **AWS_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE)])
    env.pop("VLLM_ENABLE_STARTUP_PLAN", None)
    started = time.monotonic()
    # the zygote runs in the ranks' own environment, so what vLLM and torch read at import is theirs
    zygote = (
        None
        if os.environ.get("RANKS_FRESH") == "1"
        else Zygote(root / "zygote", env, PRELOAD, own_home=False)
    )
    made: dict[str, World] = {}
    try:
        made.update(
            {
                name: World(name, tp, pp, model, root, env, zygote)
                for name, (tp, pp) in WORLDS.items()
            }
        )
        for world in made.values():
            world.accept()
        print(f"\nworlds up in {time.monotonic() - started:.1f} s (logs in {root})")
        yield made
    finally:
        for world in made.values():
            world.close()
        if zygote is not None:
            zygote.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    key_dir = tmp_path_factory.mktemp("keys")
    signer = generate_keypair(key_dir / "ci", force=False, comment="ci", env={})
    return SimpleNamespace(signer=signer, private=key_dir / "ci", trusted=key_dir / "ci.pub")


def write_plan(
    directory: Path, fp: str, keys: SimpleNamespace, kv: int = PLANNED_KV, baseline: int = 60 * GIB
) -> tuple[bytes, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    data = render_plan(Plan(fp, kv, baseline))
    sig = sign_plan(
        plan_name(fp), data, keys.signer, datetime.now(timezone.utc), provenance=conditions()
    )
    (directory / plan_name(fp)).write_bytes(data)
    (directory / sig_name(fp)).write_bytes(sig)
    return data, sig


def decision_line(outcome: dict[str, Any]) -> str:
    (line,) = [ln for ln in outcome["lines"] if ln.startswith("INFO") and "decision=" in ln]
    return line


def held(outcome: dict[str, Any]) -> float:
    """Seconds the plugin held this rank (lookup + vote): the decision line's elapsed_ms, in real
    time; the bounds on it allow tests/realtime.py's slack for six processes on two cores."""
    match = re.search(r"elapsed_ms=([0-9.]+)", decision_line(outcome))
    assert match is not None
    return float(match.group(1)) / 1000


def hold_split(outcome: dict[str, Any]) -> str:
    """A failure message: the hold, the vote's share of it and the budget the vote was given."""
    return (
        f"rank {outcome.get('rank')} held {held(outcome):.2f} s, the vote "
        f"{outcome.get('vote_s', -1):.2f} s of a {outcome.get('vote_budget_s', -1):.2f} s "
        f"budget: {decision_line(outcome)}"
    )


def _local_boot(
    world: World, keys: SimpleNamespace, tmp: Path, odd: str | None, timeout: float = 3.0
) -> dict[int, dict[str, Any]]:
    """Every rank has a signed local plan, except that the last rank is ``odd``."""
    last = world.size - 1
    cmds = {}
    for rank in range(world.size):
        cache = tmp / f"rank{rank}"
        env = {
            "VLLM_CACHE_ROOT": str(cache),
            "PLANCACHE_TRUSTED_KEYS": str(keys.trusted),
            "PLANCACHE_TIMEOUT": str(timeout),
        }
        cmd: dict[str, Any] = {"env": env}
        kind = odd if rank == last else None
        if kind != "missing" and kind != "black-holed":
            data, _ = write_plan(cache / "startup_plan", world.fingerprint(rank), keys)
            if kind == "altered":
                (cache / "startup_plan" / plan_name(world.fingerprint(rank))).write_bytes(
                    data.replace(b"53687091200", b"53687091201")
                )
        if kind == "below-baseline":
            cmd["free"] = 55 * GIB
        if kind == "unfinished":  # an earlier boot of this rank applied it and was killed
            fp = world.fingerprint(rank)
            (cache / "startup_plan" / f"plancache-applying-{fp}.json").write_text(
                json.dumps({"fingerprint": fp, "plan_sha256": hashlib.sha256(data).hexdigest()})
            )
        # past the others' bound by 2 s: a rank that waited for it cannot pass for one that did not
        if kind == "late":
            cmd["delay"] = timeout + MARGIN_S + SLACK_S + 2.0
        cmds[rank] = cmd
    return world.boot(cmds)


@pytest.mark.parametrize("name", WORLDS)
def test_ranks_are_hooked_and_have_their_own_fingerprints(
    worlds: dict[str, World], name: str
) -> None:
    world = worlds[name]
    assert all(world.info[r]["hooked"] for r in range(world.size))
    assert len({world.fingerprint(r) for r in range(world.size)}) == world.size


@pytest.mark.parametrize("name", WORLDS)
def test_all_valid_all_apply_the_same(
    worlds: dict[str, World], keys: SimpleNamespace, tmp_path: Path, name: str
) -> None:
    world = worlds[name]
    out = _local_boot(world, keys, tmp_path, None)
    for rank, o in out.items():
        assert (o["applied"], o["kv"], o["collective"]) == (True, PLANNED_KV, None), o
        line = decision_line(o)
        assert (
            f"decision=apply reason=applied source=local fingerprint={world.fingerprint(rank)}"
            in line
        )
        assert held(o) < 3.0 + MARGIN_S + SLACK_S, hold_split(o)


@pytest.mark.parametrize(
    ("odd", "own_reason"),
    [
        ("altered", "digest-mismatch"),
        ("below-baseline", "below-baseline"),
        ("missing", "no-plan"),
        ("unfinished", "unfinished-boot"),
    ],
)
@pytest.mark.parametrize("name", WORLDS)
def test_one_rank_says_no_and_every_rank_profiles(
    worlds: dict[str, World],
    keys: SimpleNamespace,
    tmp_path: Path,
    name: str,
    odd: str,
    own_reason: str,
) -> None:
    world = worlds[name]
    last = world.size - 1
    out = _local_boot(world, keys, tmp_path, odd)
    for rank, o in out.items():
        assert (o["applied"], o["kv"]) == (False, PROFILED), o
        assert o["collective"] == "ok", o  # every rank profiled together: no hang
        line = decision_line(o)
        assert (
            "decision=profile reason=rank-disagreement" in line
            and f"ranks that said no: {last}" in line
        ), line
        assert ("this rank: " + (own_reason if rank == last else "applied")) in line, line
        assert held(o) < 3.0 + MARGIN_S + SLACK_S, hold_split(o)
        if odd == "unfinished":  # issue 49: the vote applied nothing, so no rank's note is left
            # but the one an earlier boot left (cleared by the save that compares, not run here)
            notes = list((tmp_path / f"rank{rank}" / "startup_plan").glob("plancache-applying-*"))
            assert len(notes) == (1 if rank == last else 0), notes


@pytest.mark.parametrize("name", WORLDS)
def test_one_rank_with_a_black_holed_store_all_profile_within_the_budget(
    worlds: dict[str, World],
    keys: SimpleNamespace,
    tmp_path: Path,
    black_hole: BlackHole,
    name: str,
) -> None:
    world = worlds[name]
    budget = 1.0
    last = world.size - 1
    cmds = {}
    for rank in range(world.size):
        cache = tmp_path / f"rank{rank}"
        if rank != last:
            write_plan(cache / "startup_plan", world.fingerprint(rank), keys)
        cmds[rank] = {
            "env": {
                "VLLM_CACHE_ROOT": str(cache),
                "PLANCACHE_TRUSTED_KEYS": str(keys.trusted),
                "PLANCACHE_TIMEOUT": str(budget),
                "PLANCACHE_URL": "s3://bucket/plans",
                "PLANCACHE_STORAGE_OPTIONS": f'{{"endpoint_url": "{black_hole.endpoint}"}}',
            }
        }
    out = world.boot(cmds)
    # the store's rank gave up by its deadline (the store opened and read within the one budget)
    assert held(out[last]) - out[last].get("vote_s", 0.0) <= budget + JOIN_GRACE + SLACK_S, (
        hold_split(out[last])
    )
    for rank, o in out.items():
        assert (o["applied"], o["kv"], o["collective"]) == (False, PROFILED, "ok"), o
        line = decision_line(o)
        assert "reason=rank-disagreement" in line, line
        if f"ranks that said no: {last}" not in line:
            # a rank starved past the margin (its lookup was on time, above) may reach the vote
            # after the others gave up: then every rank profiles on the timed-out vote, each having
            # waited all it was given
            assert "vote failed" in line and "timed out" in line.lower(), hold_split(o)
            assert rank == last or o["vote_s"] >= o["vote_budget_s"] - 0.05, hold_split(o)
        assert held(o) < budget + MARGIN_S + SLACK_S, hold_split(o)
    assert "this rank: timeout" in decision_line(
        out[last]
    ) or "this rank: store-error" in decision_line(out[last])


@pytest.mark.parametrize("name", WORLDS)
def test_a_rank_that_votes_after_the_others_gave_up_profiles_too(
    worlds: dict[str, World], keys: SimpleNamespace, tmp_path: Path, name: str
) -> None:
    """The timed-out all_gather stays posted: the late rank completes it at once and must not
    apply."""
    world = worlds[name]
    budget = 0.5
    out = _local_boot(world, keys, tmp_path, "late", timeout=budget)
    for o in out.values():
        assert (o["applied"], o["kv"], o["collective"]) == (False, PROFILED, "ok"), o
        line = decision_line(o)
        assert "reason=rank-disagreement" in line and "vote failed" in line, line
        # the profiling collective then waits for the late rank
        assert held(o) < budget + MARGIN_S + SLACK_S, hold_split(o)
    assert "did not see every vote in time" in decision_line(out[world.size - 1])


@pytest.mark.parametrize("name", WORLDS)
def test_two_boots_after_a_failed_push_disagree_then_apply_everywhere(
    worlds: dict[str, World],
    keys: SimpleNamespace,
    tmp_path: Path,
    moto_server: MotoServer,
    name: str,
) -> None:
    import json

    world = worlds[name]
    last = world.size - 1
    bucket = moto_server.new_bucket()
    client = moto_server.client()
    # the last rank's push had failed: its plan is not in the store
    for rank in range(world.size - 1):
        data, sig = write_plan(tmp_path / "staging", world.fingerprint(rank), keys)
        client.put_object(
            Bucket=bucket, Key=f"plans/{plan_name(world.fingerprint(rank))}", Body=data
        )
        client.put_object(Bucket=bucket, Key=f"plans/{sig_name(world.fingerprint(rank))}", Body=sig)

    def env(boot: str, rank: int) -> dict[str, str]:
        return {
            "VLLM_CACHE_ROOT": str(tmp_path / boot / f"rank{rank}"),  # fresh machines each boot
            "PLANCACHE_TRUSTED_KEYS": str(keys.trusted),
            "PLANCACHE_SIGNING_KEY": str(keys.private),
            "PLANCACHE_URL": f"s3://{bucket}/plans",
            "PLANCACHE_STORAGE_OPTIONS": json.dumps(moto_server.options),
            "PLANCACHE_TIMEOUT": "3",
        }

    first = world.boot(
        {r: {"env": env("first", r), "save": True, "prefetch": True} for r in range(world.size)}
    )
    for rank, o in first.items():
        # the last rank pushes its fresh plan; the others profiled beside a signed plan they
        # verified, which stays as it was (issue 49 item 5: vLLM's save is skipped)
        assert (o["applied"], o["kv"], o["collective"], o["push"]) == (
            False,
            PROFILED,
            "ok",
            "pushed" if rank == last else None,
        ), o
        assert "reason=rank-disagreement" in decision_line(
            o
        ) and f"ranks that said no: {last}" in decision_line(o)
    assert "this rank: no-plan" in decision_line(first[last])
    keys_in_store = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"plans/{plan_name(world.fingerprint(last))}" in keys_in_store

    second = world.boot({r: {"env": env("second", r), "prefetch": True} for r in range(world.size)})
    for rank, o in second.items():
        kv = PROFILED if rank == last else PLANNED_KV  # the others' signed plans were kept
        assert (o["applied"], o["kv"], o["collective"]) == (True, kv, None), o
        assert (
            f"decision=apply reason=applied source=store fingerprint={world.fingerprint(rank)}"
            in decision_line(o)
        )


@pytest.mark.parametrize("budget", [0.0, -0.5])
@pytest.mark.parametrize("name", WORLDS)
def test_a_rank_whose_budget_is_spent_votes_profile_without_waiting(
    worlds: dict[str, World], name: str, budget: float
) -> None:
    """gloo reads a wait of 0 as *no timeout*: a rank whose budget is spent must not wait at all.

    Rank 0 votes alone first, before any peer has posted anything: it can only answer if it
    does not wait (60 s bounds a hang, it times nothing). Then the others vote with a budget:
    they see its "profile" and profile too, and the world is still in step for a full vote."""
    world = worlds[name]
    world.conns[0].send({"op": "vote", "mine": True, "budget": budget})
    assert world.conns[0].poll(60), "rank 0 with a spent budget is waiting for its peers"
    spent = world.conns[0].recv()
    assert (spent.get("all_yes"), spent.get("noes")) == (False, []) and "budget spent" in (
        spent["error"] or ""
    ), spent
    for rank in range(1, world.size):
        world.conns[rank].send({"op": "vote", "mine": True, "budget": 5.0})
    for rank in range(1, world.size):
        assert world.conns[rank].poll(60), f"rank {rank} gave no answer"
        seen = world.conns[rank].recv()
        assert (seen["all_yes"], seen["noes"], seen["error"]) == (False, [0], None), seen
    for rank in range(world.size):
        world.conns[rank].send({"op": "vote", "mine": True, "budget": 5.0})
    for rank in range(world.size):
        assert world.conns[rank].poll(60), f"rank {rank} gave no answer"
        assert world.conns[rank].recv()["all_yes"] is True


# --------------------------------------------------------------------------- last: worlds end here


@pytest.mark.parametrize("name", WORLDS)
def test_a_rank_killed_before_the_vote_the_others_profile_within_budget_and_margin(
    worlds: dict[str, World], keys: SimpleNamespace, tmp_path: Path, name: str
) -> None:
    world = worlds[name]
    budget = 1.0
    victim = world.size - 1
    world.conns[victim].send({"op": "die"})
    world.procs[victim].wait(30)
    del world.conns[victim]
    cmds = {}
    for rank in range(world.size - 1):
        cache = tmp_path / f"rank{rank}"
        write_plan(cache / "startup_plan", world.fingerprint(rank), keys)
        cmds[rank] = {
            "env": {
                "VLLM_CACHE_ROOT": str(cache),
                "PLANCACHE_TRUSTED_KEYS": str(keys.trusted),
                "PLANCACHE_TIMEOUT": str(budget),
            },
            "collective_s": 1.0,
        }
    out = world.boot(cmds)
    for o in out.values():
        assert (o["applied"], o["kv"]) == (False, PROFILED), o
        line = decision_line(o)
        assert "decision=profile reason=rank-disagreement" in line and "vote failed" in line, line
        assert held(o) < budget + MARGIN_S + SLACK_S, hold_split(o)
