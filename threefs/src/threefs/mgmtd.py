"""mgmtd: the cluster manager.

Membership by heartbeats that act as leases, the chain table with target states and chain
versions, routing information returned in every heartbeat answer (pushed when it changed) and a
primary elected through a lease record in the KV store; a standby takes over when it lapses.
"""
from __future__ import annotations

import json
import threading
import time

from . import rpc, states
from .common import setup_logging
from .kv import open_kv

LEASE_KEY = b"mgmtd/lease"
CHAINS_KEY = b"mgmtd/chains"
NODES_KEY = b"mgmtd/nodes"


class Mgmtd:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.id = str(cfg["node_id"])
        self.lease_s = float(cfg.get("lease_s", 2.0))
        self.hb_timeout = float(cfg.get("heartbeat_timeout_s", 3.0))
        self.tick_s = float(cfg.get("tick_s", 0.1))
        self.kv = open_kv(cfg["kv"])
        self.log = setup_logging(f"mgmtd-{self.id}")
        self.server = rpc.Server(cfg["listen"], cfg["secret"], self.handle, name="mgmtd")
        self.addr = self.server.addr
        self.target_node = {int(k): str(v) for k, v in cfg.get("targets", {}).items()}
        self.primary = False
        self.primary_addr = None
        self.primary_since = 0.0
        self.nodes: dict[str, dict] = {}
        self.chains: list[dict] = []
        self.routing_ver = 0
        self.term = 0
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()

    # --- lease -------------------------------------------------------------------------------
    def _lease_round(self):
        now = time.time()

        def txn(t):
            cur = t.get(LEASE_KEY)
            cur = json.loads(cur) if cur else None
            if cur is None or cur["holder"] == self.id or cur["expire"] < now:
                # a new holder starts a new term; routing versions are term << 32 | counter,
                # so they keep growing across fail-overs
                term = (cur or {}).get("term", 0)
                if cur is None or cur["holder"] != self.id or not self.primary:
                    term += 1
                t.put(LEASE_KEY, json.dumps({"holder": self.id, "addr": self.addr, "term": term,
                                             "expire": now + self.lease_s}).encode())
                return True, self.addr, term
            return False, cur["addr"], cur.get("term", 0)

        won, addr, term = self.kv.transact(txn)
        with self._lock:
            if won and not self.primary:
                self.term = term
                self._become_primary()
            elif not won and self.primary:
                self.log.warning("lost the primary lease to %s", addr)
                self.primary = False
            self.primary_addr = addr

    def _become_primary(self):
        def txn(t):
            raw = t.get(CHAINS_KEY)
            if raw:
                return json.loads(raw)
            chains = [{"id": int(c["id"]), "ver": 1,
                       "targets": [{"id": int(x), "state": "serving"} for x in c["targets"]]}
                      for c in self.cfg.get("chains", [])]
            t.put(CHAINS_KEY, json.dumps(chains).encode())
            return chains
        self.chains = self.kv.transact(txn)
        self.primary = True
        self.primary_since = time.time()
        # known nodes (addresses) survive a fail-over; their states are learned from heartbeats
        known = json.loads(self.kv.transact(lambda t: t.get(NODES_KEY)) or b"{}")
        self.nodes = {nid: {**n, "last_hb": self.primary_since, "alive": True, "targets": None}
                      for nid, n in known.items()}
        self._bump()
        self.log.info("became primary at %s with %d chains", self.addr, len(self.chains))

    def _bump(self):
        self.routing_ver = max(self.routing_ver + 1, self.term << 32)
        self._changed.notify_all()  # answers the clients waiting in watch_routing

    # --- chain states ------------------------------------------------------------------------
    def _local_states(self, now: float) -> dict:
        local = {}
        grace = now - self.primary_since < self.hb_timeout
        for tid, nid in self.target_node.items():
            n = self.nodes.get(nid)
            if n is None or n["targets"] is None or now - n["last_hb"] > self.hb_timeout:
                # right after a fail-over, nodes get one lease period to find the new primary
                local[tid] = None if grace else "offline"
            else:
                local[tid] = n["targets"].get(str(tid), "offline")
        return local

    def _tick(self):
        now = time.time()
        with self._lock:
            if not self.primary:
                return
            local = self._local_states(now)
            if any(v is None for v in local.values()):
                return
            new_chains, changed_any = [], False
            for c in self.chains:
                targets, changed = states.update_chain(c["targets"], local)
                if changed:
                    changed_any = True
                    self.log.info("chain %d v%d -> v%d: %s", c["id"], c["ver"], c["ver"] + 1,
                                  [(t["id"], t["state"]) for t in targets])
                    c = {**c, "ver": c["ver"] + 1, "targets": targets}
                new_chains.append(c)
            alive = {nid for nid, n in self.nodes.items() if now - n["last_hb"] <= self.hb_timeout}
            dead = {nid for nid, n in self.nodes.items() if nid not in alive and n.get("alive", True)}
            for nid in self.nodes:
                self.nodes[nid]["alive"] = nid in alive
            if changed_any:
                def txn(t):
                    lease = json.loads(t.get(LEASE_KEY) or b"null")
                    if not lease or lease["holder"] != self.id:
                        return False
                    t.put(CHAINS_KEY, json.dumps(new_chains).encode())
                    return True
                if not self.kv.transact(txn):
                    self.primary = False
                    return
                self.chains = new_chains
            if changed_any or dead:
                self._bump()

    def _persist_nodes(self):
        table = {nid: {"addr": n["addr"], "type": n["type"]} for nid, n in self.nodes.items()}
        raw = json.dumps(table, sort_keys=True).encode()
        self.kv.transact(lambda t: None if t.get(NODES_KEY) == raw else t.put(NODES_KEY, raw))

    def routing(self) -> dict:
        now = time.time()
        return {
            "version": self.routing_ver,
            "primary": self.addr,
            "nodes": {nid: {"addr": n["addr"], "type": n["type"],
                            "alive": now - n["last_hb"] <= self.hb_timeout,
                            "space": n.get("space")} for nid, n in self.nodes.items()},
            "targets": {str(t): n for t, n in self.target_node.items()},
            "chains": self.chains,
        }

    # --- rpc ----------------------------------------------------------------------------------
    def handle(self, method, args, data):
        if method == "status":
            with self._lock:
                return {"primary": self.primary, "primary_addr": self.primary_addr,
                        "id": self.id, "routing": self.routing() if self.primary else None}, None
        with self._lock:
            if not self.primary:
                raise rpc.RpcError("NOT_PRIMARY", "this mgmtd is a standby",
                                   primary=self.primary_addr)
            if method == "heartbeat":
                nid = str(args["node_id"])
                new = nid not in self.nodes or not self.nodes[nid].get("alive", True) \
                    or self.nodes[nid]["addr"] != args["addr"]
                self.nodes[nid] = {"addr": args["addr"], "type": args["type"],
                                   "last_hb": time.time(), "alive": True,
                                   "targets": {str(k): v for k, v in args.get("targets", {}).items()},
                                   "space": args.get("space")}
                if new:
                    self._bump()
                    self._persist_nodes()
                if args.get("routing_ver") == self.routing_ver:
                    return {"routing_ver": self.routing_ver}, None
                return {"routing_ver": self.routing_ver, "routing": self.routing()}, None
            if method == "get_routing":
                return {"routing": self.routing()}, None
            if method == "watch_routing":  # long poll: routing is pushed to clients on change
                v = args.get("version")
                self._changed.wait_for(lambda: self.routing_ver != v or not self.primary,
                                       timeout=min(float(args.get("timeout", 5.0)), 10.0))
                if self.routing_ver == v or not self.primary:
                    return {"routing_ver": self.routing_ver}, None
                return {"routing_ver": self.routing_ver, "routing": self.routing()}, None
        raise rpc.RpcError("EINVAL", f"unknown mgmtd method {method!r}")

    # --- life cycle ---------------------------------------------------------------------------
    def _loop(self):
        next_lease = 0.0
        while not self._stop.is_set():
            now = time.time()
            if now >= next_lease:
                try:
                    self._lease_round()
                except Exception as e:  # noqa: BLE001 - KV hiccup: try again next round
                    self.log.warning("lease round failed: %s", e)
                next_lease = now + self.lease_s / 3
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001
                self.log.exception("tick failed: %s", e)
            self._stop.wait(self.tick_s)

    def start(self):
        self.server.start()
        self._lease_round()
        threading.Thread(target=self._loop, daemon=True, name="mgmtd-loop").start()
        self.log.info("listening on %s", self.addr)
        return self

    def stop(self):
        self._stop.set()
        self.server.stop()
