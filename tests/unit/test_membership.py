"""The worker set as the configured source and the admin port change it (proxy/workers/membership.py)."""

from __future__ import annotations

import pytest

from proxy.frontends.workers_api import is_loopback
from proxy.workers.membership import Membership, MembershipFull, Origin, worker_url

A, B, C = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"


@pytest.mark.parametrize("raw, expected", [
    ("http://10.0.0.1:30000", "http://10.0.0.1:30000"),
    ("  https://sglang-0.llm.svc:8443/ ", "https://sglang-0.llm.svc:8443"),
    ("http://[::1]:30000", "http://[::1]:30000"),
    ("http://gateway/sglang-0/", "http://gateway/sglang-0"),
])
def test_a_worker_url_is_normalised_as_the_registry_keys_it(raw: str, expected: str) -> None:
    assert worker_url(raw) == expected


@pytest.mark.parametrize("raw, why", [
    (None, "non-empty string"),
    (30000, "non-empty string"),
    ("", "non-empty string"),
    ("10.0.0.1:30000", "http://"),
    ("ftp://10.0.0.1", "http://"),
    ("http://", "no host"),
    ("http://user:secret@10.0.0.1:30000", "credentials"),
    ("http://10.0.0.1:30000/?x=1", "query"),
    ("http://10.0.0.1:30000#top", "fragment"),
    ("http://10.0.0.1:99999", "port"),
    ("http://10.0.0.1:port", "port"),
    ("http://10.0.0.1:30000/a b", "spaces"),
    ("http://10.0.0.1:30000/\r\nX-Injected: 1", "control"),
    ("http://wörker:30000", "ASCII"),
    ("http://h/" + "a" * 3000, "longer than"),
])
def test_a_bad_worker_url_is_refused_saying_why(raw: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        worker_url(raw)


def test_members_are_the_source_plus_the_added_minus_the_removed() -> None:
    m = Membership(max_workers=8)
    assert m.from_source([A, B + "/"]) == {A, B}
    assert m.add(C) and not m.add(C) and not m.add(A)
    assert m.members() == {A, B, C}
    assert (m.origin(A), m.origin(C), m.origin("http://x:1")) == (Origin.SOURCE, Origin.API, None)
    assert m.remove(B) and not m.remove(B)
    assert m.members() == {A, C} and m.removed() == {B}
    # The source announcing again (discovery's next round) keeps the removal and the addition.
    assert m.from_source([A, B]) == {A, C}
    # An added worker stays whatever the source says.
    assert m.from_source([]) == {C}


def test_a_removal_lasts_while_the_source_lists_the_url_and_adding_it_back_undoes_it() -> None:
    m = Membership(max_workers=8)
    m.from_source([A, B])
    m.remove(B)
    assert m.from_source([A]) == {A} and m.removed() == frozenset()
    # Gone from the source, then back: a new worker at that address, not the one removed.
    assert m.from_source([A, B]) == {A, B}
    m.remove(A)
    assert m.add(A) and m.members() == {A, B} and m.origin(A) is Origin.SOURCE and not m.removed()


def test_removing_an_added_worker_the_source_does_not_list_forgets_it() -> None:
    m = Membership(max_workers=8)
    m.from_source([A])
    m.add(C)
    assert m.remove(C) and m.members() == {A} and not m.removed()
    assert m.from_source([A, C]) == {A, C}  # discovery finding a worker there later: it joins


def test_additions_stop_at_max_workers() -> None:
    m = Membership(max_workers=2)
    m.from_source([A])
    assert m.add(B)
    with pytest.raises(MembershipFull, match=r"workers.max_workers \(2\)"):
        m.add(C)
    assert not m.add(B)  # already a member: no refusal
    m.remove(B)
    assert m.add(C) and m.members() == {A, C}


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("radixgate.llm.svc", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
