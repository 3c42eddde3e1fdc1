import itertools

import pytest

from threefs import ref
from threefs.states import LOCAL_STATES, PUBLIC_STATES, next_public_state, update_chain

# The table of the issue, row by row: (local, current public, predecessor public) -> next.
# pred: "serving" / "notserving" (any other public state) / None (no predecessor) / "any".
ROWS = [
    ("uptodate", "serving", "any", "serving"),
    ("uptodate", "syncing", "any", "serving"),
    ("uptodate", "lastsrv", "any", "serving"),
    ("uptodate", "waiting", "any", "waiting"),
    ("uptodate", "offline", "any", "waiting"),
    ("online", "serving", "any", "serving"),
    ("online", "lastsrv", "any", "serving"),
    ("online", "syncing", "serving", "syncing"),
    ("online", "syncing", "notserving", "waiting"),
    ("online", "waiting", "serving", "syncing"),
    ("online", "waiting", "notserving", "waiting"),
    ("online", "offline", "any", "waiting"),
    ("offline", "serving", None, "lastsrv"),
    ("offline", "serving", "has", "offline"),
    ("offline", "syncing", "any", "offline"),
    ("offline", "waiting", "any", "offline"),
    ("offline", "offline", "any", "offline"),
    ("offline", "lastsrv", "any", "lastsrv"),
]
ALL_PREDS = [None] + list(PUBLIC_STATES)


def _preds(spec):
    if spec == "any":
        return ALL_PREDS
    if spec == "notserving":
        return [None] + [p for p in PUBLIC_STATES if p != "serving"]
    if spec == "has":
        return list(PUBLIC_STATES)
    return [spec]


@pytest.mark.parametrize("local,current,pred,want", ROWS)
def test_every_row(local, current, pred, want):
    for p in _preds(pred):
        assert next_public_state(local, current, p) == want, (local, current, p)
        assert ref.next_public_state(local, current, p) == want


def test_table_is_total_and_matches_oracle():
    covered = set()
    for local, current, pred, _ in ROWS:
        for p in _preds(pred):
            covered.add((local, current, p))
    for local, current, p in itertools.product(LOCAL_STATES, PUBLIC_STATES, ALL_PREDS):
        assert (local, current, p) in covered
        assert next_public_state(local, current, p) == ref.next_public_state(local, current, p)


def test_bad_states():
    with pytest.raises(ValueError, match="local state"):
        next_public_state("up", "serving", None)
    with pytest.raises(ValueError, match="public state"):
        next_public_state("online", "ready", None)


def ch(*pairs):
    return [{"id": i, "state": s} for i, s in pairs]


def ids_states(ts):
    return [(t["id"], t["state"]) for t in ts]


def test_head_failure_moves_to_end():
    t, changed = update_chain(ch((1, "serving"), (2, "serving"), (3, "serving")),
                              {1: "offline", 2: "uptodate", 3: "uptodate"})
    assert changed and ids_states(t) == [(2, "serving"), (3, "serving"), (1, "offline")]


def test_recovery_goes_waiting_syncing_serving():
    c = ch((2, "serving"), (3, "serving"), (1, "offline"))
    loc = {1: "online", 2: "uptodate", 3: "uptodate"}
    c, ch1 = update_chain(c, loc)
    assert ids_states(c)[-1] == (1, "waiting")
    c, ch2 = update_chain(c, loc)
    assert ids_states(c)[-1] == (1, "syncing")
    c, ch3 = update_chain(c, loc)  # still syncing until it reports up-to-date
    assert ids_states(c)[-1] == (1, "syncing") and not ch3
    c, _ = update_chain(c, {**loc, 1: "uptodate"})
    assert ids_states(c) == [(2, "serving"), (3, "serving"), (1, "serving")]


def test_all_down_keeps_lastsrv_and_only_one_syncs():
    c = ch((1, "serving"), (2, "serving"), (3, "serving"))
    c, _ = update_chain(c, {})
    assert ids_states(c) == [(1, "lastsrv"), (2, "offline"), (3, "offline")]
    # the others come back first: they wait for the last serving target
    c, _ = update_chain(c, {2: "online", 3: "online"})
    assert sorted(ids_states(c)) == [(1, "lastsrv"), (2, "waiting"), (3, "waiting")]
    c, _ = update_chain(c, {2: "online", 3: "online"})
    assert sorted(ids_states(c)) == [(1, "lastsrv"), (2, "waiting"), (3, "waiting")]
    c, _ = update_chain(c, {1: "online", 2: "online", 3: "online"})
    assert ids_states(c)[0] == (1, "serving")
    c, _ = update_chain(c, {1: "uptodate", 2: "online", 3: "online"})
    assert ids_states(c) == [(1, "serving"), (2, "syncing"), (3, "waiting")]
