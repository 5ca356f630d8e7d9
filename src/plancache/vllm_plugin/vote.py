"""Rank-consistent admission: a plan applies on every rank of a world, or on none.

Why: in vLLM 0.33 ``Worker.determine_available_memory`` returns right after ``profile_run``
on a rank that applied a plan, while a rank that profiles goes on into
``profile_cudagraph_memory``, whose tensor-parallel collectives wait for peers that never
come: a world whose ranks disagree hangs at boot. So after each rank has resolved and gated
its own plan, the ranks vote, and a plan applies only if every rank would apply it.

Which group: vLLM's *world* group (``get_world_group()``), over its CPU (gloo) group, which
exists when ``determine_available_memory`` runs. It holds every tensor- and pipeline-parallel
rank of the engine and, when vLLM launches data-parallel engines into one world (DP > 1 with
its own launcher: the world spans ``world_size_across_dp``), the ranks of the other engines
too, whose profiling runs expert-parallel collectives across engines. A world that is one
process votes with nobody: no collective at all.

How the wait is bounded: an asynchronous ``all_gather`` on the gloo group, then
``work.wait(timeout)``. What a timed-out gloo collective leaves behind (measured, torch 2.13):
the operation stays posted in the group. A peer that arrives late *completes* it and gets
the gathered votes as if in time (and the later collectives of both sides pair up in order).
Left alone, that late rank would apply while the rank that timed out profiles: the very hang
this module exists to prevent. So each rank also gathers every rank's wall-clock deadline and
counts a vote only if it completed before the earliest of them (less :data:`GUARD_S` for
clock skew): a rank that timed out did so at its deadline, so a completion it missed is late
for everyone. A peer that died makes gloo fail at once ("Connection reset by peer"); a peer
that never arrives leaves the posted ``all_gather`` pending in the group until gloo's own
timeout, which only matters to a boot that is failing anyway (that peer is gone or stuck).
The one residual risk: votes that complete within a few milliseconds of the earliest
deadline, observed on either side of it by two ranks; then one rank applies and another
profiles. It needs a vote that took the whole budget and a timing coincidence of the order
of the scheduler's jitter plus clock skew.

Every rank must call :func:`agree` exactly once per boot, whatever its own outcome (errors
included): the collectives of a group pair up by order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..trust.gate import Decision, Verdict

MARGIN_S = 1.0
"""What the vote may add to the plugin's budget: every rank's own lookup ends within the
budget, so a peer has this long beyond it to arrive (dispatch skew between workers)."""
GUARD_S = 0.25
"""A vote that completes later than the earliest rank's deadline minus this does not count
(covers clock skew between nodes and the gap between completion and a rank seeing it)."""


@dataclass(frozen=True)
class Vote:
    """The outcome of one vote. ``all_yes`` is True only if every rank said yes in time."""

    all_yes: bool
    noes: tuple[int, ...] = ()
    """World ranks that said no."""
    error: str | None = None
    """Why the vote did not complete (then ``all_yes`` is False); None if it did."""
    world_size: int = 1
    """0 when the vote failed before the world was known."""


def _world() -> Any | None:
    """vLLM's world group coordinator, or None when there is no distributed world."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from vllm.distributed.parallel_state import get_world_group

    return get_world_group()


def agree(mine: bool, budget_s: float) -> Vote:
    """Every rank says whether it would apply its plan; True for all only if every rank did.

    Waits at most ``budget_s`` seconds. Never raises: a failure of any kind is a Vote with
    ``error`` set and ``all_yes`` False (the caller profiles)."""
    try:
        world = _world()
        if world is None or world.world_size == 1:
            return Vote(mine, () if mine else (0,), None, 1)
        import torch
        import torch.distributed as dist

        budget_s = max(0.0, budget_s)
        deadline = time.time() + budget_s
        sent = torch.tensor([1.0 if mine else 0.0, deadline], dtype=torch.float64)
        gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(world.world_size)]
        work = dist.all_gather(gathered, sent, group=world.cpu_group, async_op=True)
        work.wait(timeout=timedelta(seconds=budget_s))
        done = time.time()
    except Exception as exc:  # noqa: BLE001 - timeout, a dead peer, no vLLM: profile
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return Vote(False, (), f"{type(exc).__name__}: {first}", 0)
    earliest = min(float(t[1]) for t in gathered)
    noes = tuple(r for r, t in enumerate(gathered) if float(t[0]) != 1.0)
    if done > earliest - GUARD_S:
        late = f"the vote completed {done - earliest + GUARD_S:.2f} s after the earliest rank's deadline"
        return Vote(False, noes, late, world.world_size)
    return Vote(not noes, noes, None, world.world_size)


def settle(decision: Decision, budget_s: float) -> Decision:
    """This rank's decision after the vote: unchanged if every rank agrees, else not applied.

    A rank that would have applied but a peer did not (or the vote failed) profiles with
    reason ``rank-disagreement``; a rank that said no while a peer said yes says the same, so
    every rank's INFO line names the ranks that said no. When all said no, nothing changes."""
    vote = agree(decision.applied, budget_s)
    if vote.error is None and (vote.world_size == 1 or vote.all_yes):
        return decision
    own = f"this rank: {decision.reason.value}" + (f" ({decision.detail})" if decision.detail else "")
    if vote.error is not None:
        why = f"vote failed: {vote.error}"
        if not decision.applied:
            return decision.noted(why)
    elif len(vote.noes) == vote.world_size:
        return decision  # nobody would apply: no disagreement, every rank profiles anyway
    else:
        why = "ranks that said no: " + ",".join(str(r) for r in vote.noes)
    return Decision(False, Verdict.RANK_DISAGREEMENT, f"{why}; {own}", None, decision.fingerprint)
