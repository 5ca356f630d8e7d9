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

How the wait is bounded: asynchronous ``all_gather``s on the gloo group, each followed by
``work.wait(timeout)``. What a timed-out gloo collective leaves behind (measured, torch 2.13):
the operation stays posted in the group. A peer that arrives late *completes* it and gets
the gathered votes as if in time (and the later collectives of both sides pair up in order).
Left alone, that late rank would apply while the rank that timed out profiles: the very hang
this module exists to prevent. So the vote has two rounds, and every rank posts both:

1. each rank's own yes/no, waited for within the budget;
2. each rank's *ack*: 1 if round 1 completed in time and every vote was yes, else 0. A rank
   whose round 1 timed out or failed posts its 0 and does not wait (it profiles anyway).

A plan applies only where round 2 completed and every ack is 1. A late rank completes the
posted round 1, then meets the 0 that the timed-out rank posted in round 2: it profiles too.
No clock is compared across ranks (a wall-clock deadline would turn a skewed node clock into
exactly the disagreement this prevents). A peer that died makes gloo fail at once
("Connection reset by peer"); a peer that never arrives leaves posted operations pending in the
group until gloo's own timeout, which only matters to a boot that is failing anyway.
The residual risk, as in any agreement under timeouts: every rank completes round 1 in time,
then one rank stalls between the two rounds for longer than the round-2 wait
(:data:`ROUND2_S` at least); the others then profile while it applies. It needs a rank
descheduled for that long between two consecutive collectives.

Every rank must call :func:`agree` exactly once per boot, whatever its own outcome (errors
included): the collectives of a group pair up by order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

from ..clock import Deadline
from ..trust.plans.gate import Decision, Verdict

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

MARGIN_S = 1.0
"""What the vote may add to the plugin's budget: every rank's own lookup ends within the
budget, so a peer has this long beyond it to arrive (dispatch skew between workers)."""
ROUND2_S = 1.0
"""The least time round 2 is waited for by a rank whose round 1 completed: the other ranks
that completed it post their acks right away."""


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


class WorldGroup(Protocol):
    """vLLM's world group coordinator (``get_world_group()``), as the vote reads it."""

    world_size: int
    cpu_group: ProcessGroup
    """Its gloo group: the votes are gathered there, on the CPU."""


def _world() -> WorldGroup | None:
    """vLLM's world group coordinator, or None when there is no distributed world."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from vllm.distributed.parallel_state import get_world_group

    return get_world_group()


def _gather(world: WorldGroup, value: float, wait_s: float | None) -> list[float]:
    """One all_gather of a float over the world's gloo group; ``wait_s`` None posts without
    waiting, else waits at least 1 ms (a positive budget below gloo's millisecond would round to
    "forever")."""
    import torch
    import torch.distributed as dist

    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world.world_size)]
    work = dist.all_gather(
        gathered, torch.tensor([value], dtype=torch.float64), group=world.cpu_group, async_op=True
    )
    if wait_s is None:
        return []
    # gloo counts whole milliseconds and reads 0 as "no timeout": never hand it less than 1 ms.
    work.wait(timeout=timedelta(milliseconds=max(1, math.ceil(wait_s * 1000))))
    return [float(t[0]) for t in gathered]


def _error(exc: BaseException) -> str:
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"


def _spent(world: WorldGroup) -> Vote:
    """A rank whose budget is already spent: post a no in round 1 and a 0 in round 2 without
    waiting for either (every rank posts both rounds: collectives pair up by order), then profile.
    The peers see the no as soon as they gather round 1, and profile too."""
    try:
        _gather(world, 0.0, None)
        _gather(world, 0.0, None)
    except Exception as exc:
        return Vote(False, (), f"budget spent; {_error(exc)}", world.world_size)
    return Vote(
        False, (), "budget spent before the vote: voted profile without waiting", world.world_size
    )


def agree(mine: bool, budget_s: float) -> Vote:
    """Every rank says whether it would apply its plan; True for all only if every rank did.

    Waits at most ``budget_s`` seconds for round 1 (plus at most ``max(budget_s, ROUND2_S)``
    for round 2 after a round 1 in time). A budget already spent (``budget_s <= 0``) waits not
    at all: a wait of 0 is *no timeout* to gloo, so such a rank posts "profile" in both rounds and
    returns (:func:`_spent`). Never raises: a failure of any kind is a Vote with
    ``error`` set and ``all_yes`` False (the caller profiles)."""
    try:
        world = _world()
    except Exception as exc:
        return Vote(False, (), _error(exc), 0)
    if world is None or world.world_size == 1:
        return Vote(mine, () if mine else (0,), None, 1)
    round1 = Deadline.after(budget_s)
    if budget_s <= 0:  # spent: gloo's wait(0) would mean *no* timeout; vote profile, never wait
        return _spent(world)
    try:
        votes = _gather(world, 1.0 if mine else 0.0, budget_s)
    except Exception as exc:
        try:
            _gather(world, 0.0, None)
        except Exception:
            pass
        return Vote(False, (), _error(exc), 0)
    noes = tuple(r for r, v in enumerate(votes) if v != 1.0)
    try:
        if noes:  # nobody applies: post the 0 (collectives pair by order) and go profile
            _gather(world, 0.0, None)
            return Vote(False, noes, None, world.world_size)
        acks = _gather(world, 1.0, max(round1.remaining(), ROUND2_S))
    except Exception as exc:
        return Vote(False, noes, f"round 2: {_error(exc)}", world.world_size)
    unsure = tuple(r for r, a in enumerate(acks) if a != 1.0)
    if unsure:
        ranks = ",".join(map(str, unsure))
        return Vote(False, (), f"rank(s) {ranks} did not see every vote in time", world.world_size)
    return Vote(True, (), None, world.world_size)


def settle(decision: Decision, budget_s: float) -> Decision:
    """This rank's decision after the vote: unchanged if every rank agrees, else not applied.

    A rank that would have applied but a peer did not (or the vote failed) profiles with
    reason ``rank-disagreement``; a rank that said no while a peer said yes says the same, so
    every rank's INFO line names the ranks that said no. When all said no, nothing changes."""
    vote = agree(decision.applied, budget_s)
    if vote.error is None and (vote.world_size == 1 or vote.all_yes):
        return decision
    own = f"this rank: {decision.reason.value}" + (
        f" ({decision.detail})" if decision.detail else ""
    )
    if vote.error is not None:
        why = f"vote failed: {vote.error}"
        if not decision.applied:
            return decision.noted(why)
    elif len(vote.noes) == vote.world_size:
        return decision  # nobody would apply: no disagreement, every rank profiles anyway
    else:
        why = "ranks that said no: " + ",".join(str(r) for r in vote.noes)
    return Decision(False, Verdict.RANK_DISAGREEMENT, f"{why}; {own}", None, decision.fingerprint)
