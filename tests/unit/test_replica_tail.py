"""loadtests.replica_tail.tail_origin: where the slowest requests arrived, and which early
followers of a group (before its first request's first token) left the group's worker."""

from loadtests.replica_tail import tail_origin
from loadtests.routing_sim import Outcome


def outcome(group: str, arrival: float, worker: str, ttft: float, branch: str = "affinity") -> Outcome:
    return Outcome(group=group, arrival=arrival, worker=worker, first=arrival + ttft, done=arrival + ttft + 1,
                   branch=branch)


def test_early_followers_that_left_the_group_split_it() -> None:
    outs = [
        outcome("a", 0.0, "w0", 0.5, "balance"),
        outcome("a", 0.1, "w1", 0.4, "balance"),   # before a's first token, elsewhere
        outcome("a", 0.2, "w0", 0.3, "balance"),   # before it, same worker
        outcome("a", 2.0, "w0", 0.01),             # after: not early
        outcome("b", 0.3, "w2", 0.02, "balance"),
        outcome("b", 0.9, "w2", 0.02),
    ]
    r = tail_origin(outs)
    assert r["early_balance"] == 2
    assert r["early_elsewhere"] == 1
    assert r["whole"] == 0.5


def test_slowest_requests_by_arrival_second() -> None:
    outs = [outcome(f"g{i}", float(i), "w0", 0.01) for i in range(1, 40)]
    outs.append(outcome("late", 0.5, "w1", 9.0))   # the slowest, in the first second
    outs.append(outcome("late2", 30.0, "w1", 8.0))  # second slowest, later
    r = tail_origin(outs)
    # 41 requests: the slowest 5% is the top 3 (from index 38): two slow ones and one fast.
    assert abs(r["p95"] - 0.01) < 1e-9
    assert abs(r["top_in_first_s"] - 1 / 3) < 1e-9
