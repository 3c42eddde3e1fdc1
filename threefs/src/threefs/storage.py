"""Storage service: chunk engines of local targets + CRAQ replication.

Writes enter at the chain head, which makes a pending version, forwards it to its successor and
commits after the successor's ack; the tail commits at once, so acks travel back up the chain.
Every request carries the chain version and is refused (CHAIN_VERSION) when it differs. Reads are
answered by any serving replica; one holding a pending version answers NOT_COMMITTED (the client
then reads the tail). A syncing successor receives full-chunk replaces, while its predecessor
copies the chunks whose metadata differ, then reports sync done.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time

from . import _C, rpc, shortcircuit
from .chunk import (ChecksumError, ChunkEngine, VersionError, crc32c, crc32c_sums, inode_prefix,
                    split_chunk_id)
from .common import MgmtdClient, setup_logging
from .routing import Routing

# a successor's refusals that no retry changes: the version is dropped on the way back up the chain (as fastpath.cpp's
# refused_for_good)
REFUSED_FOR_GOOD = ("ENOSPC", "EINVAL", "EFBIG")


class _ChunkLock:
    """`with node.locks((tid, cid)):` - the per-chunk lock, in the table of the C++ data path
    (_C.FastPath), which takes the same locks for the forwards it handles."""

    __slots__ = ("fp", "key")

    def __init__(self, fp, key):
        self.fp, self.key = fp, struct.pack("<q", key[0]) + key[1]

    def __enter__(self):
        self.fp.lock(self.key)

    def __exit__(self, *exc):
        self.fp.unlock(self.key)


def _meta_tuple(cid: bytes, m: dict) -> list:
    return [cid.hex(), m["committed_ver"], m["pending_ver"], m["size"], m["crc"]]


class StorageNode:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.id = str(cfg["node_id"])
        self.log = setup_logging(f"storage-{self.id}")
        self.hb_s = float(cfg.get("heartbeat_s", 0.3))
        self.verify_reads = bool(cfg.get("verify_reads", True))
        self.engines: dict[int, ChunkEngine] = {}
        for t in cfg["targets"]:
            self.engines[int(t["id"])] = ChunkEngine(
                t["path"], cfg.get("fsync", "none"), int(t.get("capacity", 1 << 40)),
                int(cfg.get("max_chunk_size", 4 << 20)))
        self.local = {tid: "online" for tid in self.engines}
        self.synced_at: dict[int, int] = {}
        self.routing = Routing()
        self.rpc = rpc.Client(cfg["secret"])
        # full-chunk forwards down the chain go as kind-3 frames (payload covered by its CRC32C
        # in the MACed meta, rpc.py) unless fwd_payload_mac = true asks for the payload MAC
        self.fwd_mac = bool(cfg.get("fwd_payload_mac", False))
        self.mgmtd = MgmtdClient(cfg["mgmtd"], self.rpc)
        # the C++ full-chunk write path (fastpath.h): it serves the ordinary full-chunk forwards
        # of every connection and the head's forward of a full-chunk write; the per-chunk locks
        # live in its table. fast_path = false (or fwd_payload_mac, whose forwards it does not
        # send) leaves every request to Python.
        self.fp = _C.FastPath(rpc._secret_bytes(cfg["secret"]))
        for tid, eng in self.engines.items():
            self.fp.add_engine(tid, eng._e)
        self.fast = bool(cfg.get("fast_path", True)) and not self.fwd_mac
        self.locks = lambda key: _ChunkLock(self.fp, key)
        self.server = rpc.Server(cfg["listen"], cfg["secret"], self.handle, name="storage")
        if self.fast:
            self.server.fast = self.fp
        self.addr = self.server.addr
        # short-circuit reads for clients on this host (shortcircuit.py); short_circuit = false
        # in the config turns them off (those clients then read over TCP)
        self.sc = None
        if cfg.get("short_circuit", True):
            try:
                self.sc = shortcircuit.Server(self, cfg["secret"])
            except OSError as e:
                self.log.warning("no short-circuit socket for %s: %s", self.addr, e)
        self._stop = threading.Event()
        self._hb_now = threading.Event()
        self._rlock = threading.Lock()
        self._syncs: set = set()
        self.stats = {"repairs": 0, "syncs": 0, "synced_chunks": 0}

    # --- routing ------------------------------------------------------------------------------
    def _apply_routing(self, raw: dict):
        with self._rlock:
            if raw["version"] < self.routing.version:
                return
            self.routing = r = Routing(raw)
            for c in r.chains.values():
                for t in c["targets"]:
                    tid = t["id"]
                    if tid not in self.engines:
                        continue
                    if t["state"] == "serving":
                        self.local[tid] = "uptodate"
                    elif t["state"] == "syncing" and self.synced_at.get(tid) == c["ver"]:
                        self.local[tid] = "uptodate"
                    else:
                        self.local[tid] = "online"
            self.fp.set_chains(self._fast_chains(r))

    def _fast_chains(self, r: Routing) -> list:
        """Rows (chain, version, my target or -1, takes writes, successor address or "", is
        the head) of the C++ data path's chain table; a chain whose successor has no address
        takes no writes there (Python answers those)."""
        rows = []
        for cid, c in r.chains.items():
            tid = next((t["id"] for t in c["targets"] if t["id"] in self.engines), -1)
            wl = [t["id"] for t in Routing.write_list(c)]
            writes, succ = tid in wl, ""
            if writes and wl.index(tid) + 1 < len(wl):
                succ = r.addr_of(wl[wl.index(tid) + 1]) or ""
                writes = bool(succ)
            rows.append((cid, int(c["ver"]), tid, writes, succ, bool(wl) and wl[0] == tid))
        return rows

    def _heartbeat(self):
        space = {str(t): [e.used_bytes(), e.capacity_bytes()] for t, e in self.engines.items()}
        res = self.mgmtd.call("heartbeat", {
            "node_id": self.id, "addr": self.addr, "type": "storage",
            "targets": {str(t): s for t, s in self.local.items()}, "space": space,
            "routing_ver": self.routing.version}, deadline_s=2.0)
        if "routing" in res:
            self._apply_routing(res["routing"])

    def refresh_routing(self):
        self._apply_routing(self.mgmtd.call("get_routing", deadline_s=3.0)["routing"])

    def _my(self, args) -> tuple[int, dict]:
        """(my target id, chain) for a request, after the chain-version check."""
        cid, cv = int(args["chain"]), int(args["chain_ver"])
        chain = self.routing.chain(cid)
        if chain is None or cv > chain["ver"]:
            try:
                self.refresh_routing()
            except ConnectionError:
                pass
            chain = self.routing.chain(cid)
        if chain is None:
            raise rpc.RpcError("EINVAL", f"unknown chain {cid}")
        if cv != chain["ver"]:
            raise rpc.RpcError("CHAIN_VERSION", f"chain {cid} is at v{chain['ver']}, request v{cv}",
                               ver=chain["ver"])
        for t in chain["targets"]:
            if t["id"] in self.engines:
                return t["id"], chain
        raise rpc.RpcError("EINVAL", f"no target of chain {cid} on node {self.id}")

    def _successor(self, chain, tid):
        wl = Routing.write_list(chain)
        ids = [t["id"] for t in wl]
        if tid not in ids:
            raise rpc.RpcError("NOT_SERVING", f"target {tid} does not take writes on chain "
                               f"{chain['id']} v{chain['ver']}")
        i = ids.index(tid)
        return wl[i + 1] if i + 1 < len(wl) else None, i

    # --- CRAQ write path ----------------------------------------------------------------------
    def _forward(self, chain, tid, cid, ver, off, trunc, data, crc, whole=False):
        """Send version `ver` to the successor (if any). whole: `data` is the chunk's entire
        new content, sent as a full-chunk replace."""
        succ, _ = self._successor(chain, tid)
        if succ is None:
            return
        eng = self.engines[tid]
        args = {"chain": chain["id"], "chain_ver": chain["ver"], "chunk": cid.hex(), "ver": ver,
                "offset": off, "truncate_to": trunc, "crc": crc, "full": bool(whole)}
        addr = self.routing.addr_of(succ["id"])
        if addr is None:
            raise ConnectionError(f"no address for target {succ['id']}")
        if whole or succ["state"] != "syncing":
            try:
                self.rpc.call(addr, "fwd", args, data)
                return
            except rpc.RpcError as e:
                if e.code != "NEED_FULL" or whole:
                    raise
        full = eng.read(cid, pending=eng.meta(cid)["pending_ver"] == ver)
        args.update(offset=0, truncate_to=-1, full=True)
        self.rpc.call(addr, "fwd", args, full)

    def _apply(self, tid, chain, cid, ver, off, trunc, data, crc, full, sums=None):
        eng = self.engines[tid]
        m = eng.meta(cid) or {"committed_ver": 0, "pending_ver": 0, "crc": 0, "pending_crc": 0}
        latest = m["pending_ver"] or m["committed_ver"]
        latest_crc = m["pending_crc"] if m["pending_ver"] else m["crc"]
        if latest == ver and latest_crc == crc:
            return  # already applied (a retried forward)
        if full:  # crc is the CRC32C of the whole new content: check the sender's claim
            nm = eng.update(cid, ver, chain["ver"], 0, data if data is not None else b"",
                            full_replace=True, sums=sums)
            if nm["pending_crc"] != crc:
                eng.abort(cid, ver)
                raise rpc.RpcError("CHECKSUM", "full-chunk payload does not match its CRC32C")
            return
        if latest != ver - 1:
            raise rpc.RpcError("NEED_FULL", f"have v{latest}, got v{ver}")
        nm = eng.update(cid, ver, chain["ver"], off, data if data is not None else b"", trunc)
        if nm["pending_crc"] != crc:
            raise rpc.RpcError("NEED_FULL", "content differs from the predecessor's")

    def _local_and_forward(self, local, chain, tid, cid, ver, data, crc):
        """Full-chunk write: send it to the successor first (the socket takes the whole frame
        without blocking), apply it locally while the successor works, then wait for its ack.
        Both must succeed. One thread: no hand-off to a helper thread and back. The local space
        is taken before anything is sent (ChunkEngine.reserve), so that a write this target
        cannot hold is refused before a successor applies (and the tail commits) it."""
        succ, _ = self._successor(chain, tid)
        addr = self.routing.addr_of(succ["id"])
        if addr is None:
            raise ConnectionError(f"no address for target {succ['id']}")
        args = {"chain": chain["id"], "chain_ver": chain["ver"], "chunk": cid.hex(), "ver": ver,
                "offset": 0, "truncate_to": -1, "crc": crc, "full": True}
        eng = self.engines[tid]
        eng.reserve(cid, len(data))
        try:
            pending = self.rpc.start(addr, "fwd", args, data, crc=None if self.fwd_mac else crc)
            try:
                out = local()
            except BaseException:
                pending.cancel()
                raise
            pending.finish()
            return out
        finally:
            eng.unreserve(cid)  # (a no-op once the local update used it)

    def _write(self, args, data):
        tid, chain = self._my(args)
        wl = Routing.write_list(chain)
        if not wl or wl[0]["id"] != tid:
            raise rpc.RpcError("NOT_HEAD", f"target {tid} is not the head of chain {chain['id']}")
        cid = bytes.fromhex(args["chunk"])
        off, trunc = int(args.get("offset", 0)), int(args.get("truncate_to", -1))
        d = data if data is not None else b""
        eng = self.engines[tid]
        with self.locks((tid, cid)):
            m = eng.meta(cid)
            latest = (m["pending_ver"] or m["committed_ver"]) if m else 0
            base = ((m["pending_size"] if m["pending_ver"] else m["size"]) if m else 0)
            ver = latest + 1
            # a write covering the whole chunk: its content is known up front, so the local
            # copy-on-write and the forwarding down the chain run at the same time
            whole = off == 0 and trunc < 0 and len(d) > 0 and len(d) >= base
            try:
                succ = self._successor(chain, tid)[0] if whole else None
                if succ is not None and self.fast and len(d) <= eng.max_chunk_size:
                    self._head_write_fast(tid, chain, cid, ver, d, succ)
                elif succ is not None:
                    sums = crc32c_sums(d)  # one pass: the forward's CRC and the engine's sums
                    crc = sums[0]
                    self._local_and_forward(
                        lambda: eng.update(cid, ver, chain["ver"], 0, d, -1, sums=sums),
                        chain, tid, cid, ver, d, crc)
                else:
                    nm = eng.update(cid, ver, chain["ver"], off, d, trunc)
                    self._forward(chain, tid, cid, ver, off, trunc, d, nm["pending_crc"])
            except rpc.RpcError as e:
                if e.code in REFUSED_FOR_GOOD:
                    eng.abort(cid, ver)  # refused downstream for good: nothing was applied
                raise
            except ConnectionError as e:
                raise rpc.RpcError("RETRY", f"successor unreachable: {e}")
            eng.commit(cid, ver)
        return {"ver": ver}, None

    def _head_write_fast(self, tid, chain, cid, ver, d, succ):
        """_local_and_forward of a full-chunk write in C++ (GIL released): forward, local
        pending version, the successor's ack. Raises as the Python path does."""
        addr = self.routing.addr_of(succ["id"])
        if addr is None:
            raise ConnectionError(f"no address for target {succ['id']}")
        st, text = self.fp.head_write(tid, chain["id"], chain["ver"], cid, ver, d,
                                      crc32c_sums(d), addr)
        if st == 2:
            raise ConnectionError(f"rpc fwd to {addr} failed: {text}")
        if st == 1:
            res = json.loads(text)
            raise rpc.RpcError(res["err"], res.get("msg", ""),
                               **{k: v for k, v in res.items() if k not in ("err", "msg")})

    def _fwd(self, args, data):
        tid, chain = self._my(args)
        succ, _ = self._successor(chain, tid)
        cid = bytes.fromhex(args["chunk"])
        ver, crc, full = int(args["ver"]), int(args["crc"]), bool(args["full"])
        off, trunc = int(args["offset"]), int(args["truncate_to"])
        # a kind-3 frame's payload CRCs, computed by rpc.Channel.recv while checking it
        sums = args.get("_sums") if full else None
        with self.locks((tid, cid)):
            try:
                if full and succ is not None:
                    self._local_and_forward(
                        lambda: self._apply(tid, chain, cid, ver, off, trunc, data, crc, True,
                                            sums),
                        chain, tid, cid, ver, data if data is not None else b"", crc)
                else:
                    self._apply(tid, chain, cid, ver, off, trunc, data, crc, full, sums)
                    self._forward(chain, tid, cid, ver, off, trunc, data, crc)
            except rpc.RpcError as e:
                if e.code in REFUSED_FOR_GOOD:
                    self.engines[tid].abort(cid, ver)  # refused downstream for good: drop it here too
                raise
            except ConnectionError as e:
                raise rpc.RpcError("RETRY", f"successor unreachable: {e}")
            m = self.engines[tid].meta(cid)
            if m and m["pending_ver"] == ver:
                self.engines[tid].commit(cid, ver)
        return {"ver": ver}, None

    # --- reads --------------------------------------------------------------------------------
    def _read_one(self, tid, chain, cid, off, length):
        eng = self.engines[tid]
        m = eng.meta(cid)
        if m and m["pending_ver"]:
            succ, _ = self._successor(chain, tid)
            if succ is not None:
                raise rpc.RpcError("NOT_COMMITTED", f"chunk {cid.hex()} has pending "
                                   f"v{m['pending_ver']}")
            with self.locks((tid, cid)):  # the tail: nothing downstream, its pending is final
                m = eng.meta(cid)
                if m and m["pending_ver"]:
                    eng.commit(cid, m["pending_ver"])
                    m = eng.meta(cid)
        try:
            d = eng.read(cid, off, length, self.verify_reads)
        except ChecksumError as e:
            self.log.warning("target %d chunk %s: %s; repairing", tid, cid.hex(), e)
            full = self._repair(tid, chain, cid)
            d = full[off:off + length]
        return (m["committed_ver"] if m else 0), d

    def _read_zc(self, tid, chain, cid, off, length):
        """Zero-copy read: the committed bytes go from the chunk file into the socket with
        sendfile (rpc.FileSlice), unverified here; the client checks them against the stored
        CRC32C sent along and, on a mismatch, reads again without zc (verified here, repaired).
        None when this read needs the ordinary path (pending version, unaligned range, corrupt
        header, nothing committed)."""
        eng = self.engines[tid]
        m = eng.meta(cid)
        if not m or m["pending_ver"] or not m["committed_ver"]:
            return None
        try:
            st, sp = eng.open_span(cid, off, length)
        except ChecksumError:
            return None
        if st != 1:
            return None
        fs = rpc.FileSlice(sp.fd, sp.file_offset, sp.n, crc=sp.crc if sp.whole else None,
                           block_crcs=None if sp.whole else sp.block_crcs, close=sp.close)
        return {"ver": m["committed_ver"], "found": True}, fs

    def sc_open(self, args):
        """A short-circuit read (shortcircuit.Server): the checks of a TCP read, then the
        committed chunk file opened for the client (result, span) - or (result, None) when the
        chunk has nothing committed. SC_FALLBACK where the TCP path must decide (a pending
        version: NOT_COMMITTED or the tail's commit; a range not 4 KiB-aligned; a damaged
        header, which the TCP path repairs)."""
        tid, chain = self._my(args)
        if not any(t["id"] == tid and t["state"] == "serving" for t in chain["targets"]):
            raise rpc.RpcError("NOT_SERVING", f"target {tid} is not serving")
        cid = bytes.fromhex(args["chunk"])
        off, length = int(args["offset"]), int(args["length"])
        eng = self.engines[tid]
        m = eng.meta(cid)
        if m and m["pending_ver"]:
            raise rpc.RpcError("SC_FALLBACK", "pending version")
        if not m or not m["committed_ver"]:
            return {"ver": 0, "found": False, "n": 0}, None
        try:
            st, sp = eng.open_span(cid, off, length)
        except ChecksumError:
            raise rpc.RpcError("SC_FALLBACK", "damaged chunk header") from None
        if st == 0:
            return {"ver": 0, "found": False, "n": 0}, None
        if st != 1:
            raise rpc.RpcError("SC_FALLBACK", "range not 4 KiB-aligned")
        res = {"ver": m["committed_ver"], "found": True, "n": sp.n, "off": sp.file_offset}
        if sp.whole:
            res["_crc"] = sp.crc
        else:
            res["_bcrc"] = sp.block_crcs.hex()
        return res, sp

    def _repair(self, tid, chain, cid) -> bytes:
        for t in Routing.serving(chain):
            if t["id"] == tid:
                continue
            addr = self.routing.addr_of(t["id"])
            if addr is None:
                continue
            try:
                res, d = self.rpc.call(addr, "get_chunk", {"chain": chain["id"],
                                                           "chain_ver": chain["ver"],
                                                           "chunk": cid.hex()})
            except (rpc.RpcError, ConnectionError):
                continue
            d = bytes(d or b"")
            if crc32c(d) != res["crc"]:
                continue
            with self.locks((tid, cid)):
                m = self.engines[tid].meta(cid)
                if m and m["committed_ver"] == res["ver"] and not m["pending_ver"]:
                    self.engines[tid].replace_committed(cid, res["ver"], chain["ver"], d)
                    self.stats["repairs"] += 1
            return d
        raise rpc.RpcError("CHECKSUM", f"chunk {cid.hex()} is corrupt and no replica could "
                           "repair it")

    def _read(self, args, data):
        tid, chain = self._my(args)
        if not any(t["id"] == tid and t["state"] == "serving" for t in chain["targets"]):
            raise rpc.RpcError("NOT_SERVING", f"target {tid} is not serving")
        if args.get("zc"):
            out = self._read_zc(tid, chain, bytes.fromhex(args["chunk"]), int(args["offset"]),
                                int(args["length"]))
            if out is not None:
                return out
        ver, d = self._read_one(tid, chain, bytes.fromhex(args["chunk"]), int(args["offset"]),
                                int(args["length"]))
        return {"ver": ver, "found": d is not None}, d

    def _batch_read(self, args, data):
        out, parts = [], []
        for r in args["reqs"]:
            try:
                res, d = self._read(r, None)
                out.append({"n": len(d) if d is not None else 0, "found": res["found"]})
                if d:
                    parts.append(d)
            except rpc.RpcError as e:
                out.append({"err": e.code, "msg": e.msg})
        return {"res": out}, parts or None

    # --- sync and repair support ----------------------------------------------------------------
    def _get_chunk(self, args, data):
        tid, chain = self._my(args)
        cid = bytes.fromhex(args["chunk"])
        m = self.engines[tid].meta(cid)
        if not m or not m["committed_ver"]:
            raise rpc.RpcError("NOT_FOUND", "no committed chunk")
        d = self.engines[tid].read(cid)  # verified
        return {"ver": m["committed_ver"], "crc": crc32c(d)}, d

    def _meta_list(self, args, data):
        tid = self._target_of_chain(int(args["chain"]))
        prefix = bytes.fromhex(args.get("prefix", ""))
        return {"chunks": [_meta_tuple(c, m) for c, m in self.engines[tid].list(prefix)]}, None

    def _target_of_chain(self, cid):
        chain = self.routing.chain(cid)
        for t in (chain or {"targets": []})["targets"]:
            if t["id"] in self.engines:
                return t["id"]
        raise rpc.RpcError("EINVAL", f"no target of chain {cid} here")

    def _sync_put(self, args, data):
        tid, chain = self._my(args)
        if not any(t["id"] == tid and t["state"] == "syncing" for t in chain["targets"]):
            raise rpc.RpcError("NOT_SYNCING", f"target {tid} is not syncing")
        cid = bytes.fromhex(args["chunk"])
        d = bytes(data or b"")
        if crc32c(d) != int(args["crc"]):
            raise rpc.RpcError("CHECKSUM", "sync payload checksum mismatch")
        with self.locks((tid, cid)):
            self.engines[tid].replace_committed(cid, int(args["ver"]), chain["ver"], d)
        return {}, None

    def _sync_remove(self, args, data):
        tid, chain = self._my(args)
        cid = bytes.fromhex(args["chunk"])
        with self.locks((tid, cid)):
            self.engines[tid].remove(cid)
        return {}, None

    def _sync_done(self, args, data):
        tid, chain = self._my(args)
        self.synced_at[tid] = chain["ver"]
        self.local[tid] = "uptodate"
        self._hb_now.set()
        self.log.info("target %d synced on chain %d v%d", tid, chain["id"], chain["ver"])
        return {}, None

    def _sync_chain(self, chain, tid, dst):
        key = (chain["id"], chain["ver"], dst["id"])
        try:
            addr = self.routing.addr_of(dst["id"])
            base = {"chain": chain["id"], "chain_ver": chain["ver"]}
            res, _ = self.rpc.call(addr, "meta_list", base)
            theirs = {bytes.fromhex(c[0]): c for c in res["chunks"]}
            eng = self.engines[tid]
            mine = {c: m for c, m in eng.list()}
            n = 0
            for cid in sorted(set(mine) | set(theirs)):
                if self._stop.is_set():
                    return
                with self.locks((tid, cid)):
                    m = eng.meta(cid)
                    t = theirs.get(cid)
                    if m is None or not m["committed_ver"]:
                        if t is not None and m is None:
                            self.rpc.call(addr, "sync_remove", {**base, "chunk": cid.hex()})
                        continue
                    if t and t[1] == m["committed_ver"] and t[4] == m["crc"] and not t[2]:
                        continue
                    d = eng.read(cid)
                    self.rpc.call(addr, "sync_put", {**base, "chunk": cid.hex(),
                                                     "ver": m["committed_ver"], "crc": crc32c(d)}, d)
                    n += 1
            self.rpc.call(addr, "sync_done", base)
            self.stats["syncs"] += 1
            self.stats["synced_chunks"] += n
            self.log.info("synced chain %d to target %d: %d chunks copied", chain["id"],
                          dst["id"], n)
        except Exception as e:  # noqa: BLE001 - retried on the next round
            self.log.warning("sync of chain %d to %d failed: %s", chain["id"], dst["id"], e)
            time.sleep(0.2)
            self._syncs.discard(key)  # done keys stay: one sync per (chain, version, target)

    def _sync_round(self):
        for chain in list(self.routing.chains.values()):
            wl = Routing.write_list(chain)
            for i, t in enumerate(wl):
                if t["state"] == "syncing" and i > 0 and wl[i - 1]["id"] in self.engines \
                        and wl[i - 1]["state"] == "serving":
                    key = (chain["id"], chain["ver"], t["id"])
                    if key not in self._syncs:
                        self._syncs.add(key)
                        threading.Thread(target=self._sync_chain, args=(chain, wl[i - 1]["id"], t),
                                         daemon=True).start()

    # --- inode-wide operations ------------------------------------------------------------------
    def _last_chunk(self, args, data):
        tid = self._target_of_chain(int(args["chain"]))
        best = None
        for cid, m in self.engines[tid].list(inode_prefix(int(args["inode"]))):
            if m["committed_ver"] and m["size"]:
                best = (split_chunk_id(cid)[1], m["size"])
        return {"last": best}, None

    def _remove_inode(self, args, data):
        tid, chain = self._my(args)
        if not args.get("fwd"):
            wl = Routing.write_list(chain)
            if not wl or wl[0]["id"] != tid:
                raise rpc.RpcError("NOT_HEAD", "not the head")
        eng = self.engines[tid]
        n = 0
        for cid, _ in eng.list(inode_prefix(int(args["inode"]))):
            with self.locks((tid, cid)):
                n += eng.remove(cid)
        succ, _ = self._successor(chain, tid)
        if succ is not None:
            try:
                addr = self.routing.addr_of(succ["id"])
                if addr is None:
                    raise ConnectionError(f"address of target {succ['id']} unknown")
                self.rpc.call(addr, "remove_inode", {**args, "fwd": True})
            except ConnectionError as e:
                raise rpc.RpcError("RETRY", str(e))
        return {"removed": n}, None

    def _space(self, args, data):
        return {"targets": {str(t): [e.used_bytes(), e.capacity_bytes(), e.chunk_count()]
                            for t, e in self.engines.items()},
                "local": {str(t): s for t, s in self.local.items()},
                "stats": {**self.stats, "fast_fwds": self.fp.handled}}, None

    HANDLERS = {"write": _write, "fwd": _fwd, "read": _read, "batch_read": _batch_read,
                "get_chunk": _get_chunk, "meta_list": _meta_list, "sync_put": _sync_put,
                "sync_remove": _sync_remove, "sync_done": _sync_done, "last_chunk": _last_chunk,
                "remove_inode": _remove_inode, "space": _space}

    def handle(self, method, args, data):
        h = self.HANDLERS.get(method)
        if h is None:
            raise rpc.RpcError("EINVAL", f"unknown storage method {method!r}")
        try:
            return h(self, args, data)
        except VersionError as e:
            raise rpc.RpcError("NEED_FULL", str(e))
        except ChecksumError as e:
            raise rpc.RpcError("CHECKSUM", str(e))
        except (KeyError, TypeError) as e:
            raise rpc.RpcError("EINVAL", f"bad request arguments: {e!r}")

    # --- life cycle ---------------------------------------------------------------------------
    def _loop(self):
        next_hb = 0.0
        while not self._stop.is_set():
            now = time.time()
            if now >= next_hb or self._hb_now.is_set():
                self._hb_now.clear()
                try:
                    self._heartbeat()
                except Exception as e:  # noqa: BLE001 - mgmtd may be failing over
                    self.log.warning("heartbeat failed: %s", e)
                next_hb = now + self.hb_s
            try:
                self._sync_round()
            except Exception as e:  # noqa: BLE001
                self.log.warning("sync round failed: %s", e)
            self._hb_now.wait(0.05)

    def start(self):
        self.server.start()
        if self.sc is not None:
            self.sc.start()
        threading.Thread(target=self._loop, daemon=True, name="storage-loop").start()
        self.log.info("listening on %s with targets %s", self.addr, sorted(self.engines))
        return self

    def stop(self):
        self._stop.set()
        self.server.stop()
        if self.sc is not None:
            self.sc.stop()
