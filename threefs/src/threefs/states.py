"""Target state machine of a chain (the 3FS table) and chain reordering.

Local states (reported by the storage node): uptodate, online, offline (no heartbeat).
Public states (decided by mgmtd): serving, syncing, waiting, lastsrv, offline.
"""
from __future__ import annotations

LOCAL_STATES = ("uptodate", "online", "offline")
PUBLIC_STATES = ("serving", "syncing", "waiting", "lastsrv", "offline")
_ORDER = {"serving": 0, "syncing": 1, "waiting": 2, "lastsrv": 3, "offline": 4}


def next_public_state(local: str, current: str, pred: str | None) -> str:
    """Next public state from (local state, current public state, predecessor's public state).

    pred is None when the target has no predecessor in the (reordered) chain.
    """
    if local not in LOCAL_STATES:
        raise ValueError(f"local state must be one of {LOCAL_STATES}, got {local!r}")
    if current not in PUBLIC_STATES:
        raise ValueError(f"public state must be one of {PUBLIC_STATES}, got {current!r}")
    if local == "uptodate":
        return "waiting" if current in ("waiting", "offline") else "serving"
    if local == "online":
        if current in ("serving", "lastsrv"):
            return "serving"
        if current in ("syncing", "waiting"):
            return "syncing" if pred == "serving" else "waiting"
        return "waiting"  # offline
    # local offline
    if current == "serving":
        return "lastsrv" if pred is None else "offline"
    if current == "lastsrv":
        return "lastsrv"
    return "offline"


def update_chain(targets: list[dict], local: dict) -> tuple[list[dict], bool]:
    """One mgmtd round for a chain.

    targets: [{"id": int, "state": public state}, ...] in chain order (head first);
    local: {target id: local state} (missing: offline).
    Targets whose local state is offline move to the chain's end first (stable), then each
    target's next state is computed with its predecessor's new public state, then the chain is
    reordered serving, syncing, waiting, lastsrv, offline (stable). Returns (new targets, changed).
    """
    order = ([t for t in targets if local.get(t["id"], "offline") != "offline"]
             + [t for t in targets if local.get(t["id"], "offline") == "offline"])
    new, pred = [], None
    for t in order:
        s = next_public_state(local.get(t["id"], "offline"), t["state"], pred)
        new.append({**t, "state": s})
        pred = s
    new.sort(key=lambda t: _ORDER[t["state"]])
    changed = [(t["id"], t["state"]) for t in new] != [(t["id"], t["state"]) for t in targets]
    return new, changed
