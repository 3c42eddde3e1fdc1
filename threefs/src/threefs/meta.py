"""Meta service: a stateless file-system namespace over a transactional KV store.

Keys:  b"I" + inode id (u64 BE)            -> inode (JSON)
       b"D" + parent id (u64 BE) + name     -> directory entry {"id": child inode id}
       b"N"                                 -> next inode id
       b"G" + inode id                      -> file whose chunks await garbage collection
       b"S" + inode id + session id         -> last renewal time of a write session (a lease:
                                               sessions of clients that stop renewing are
                                               closed by the meta service, settling the length)
Files keep their layout: chunk size, stripe and the chains of their chunks (chunk i goes to
chains[i % stripe]). A file's length is settled on close/fsync by asking, for each chain, the
storage for its last chunk of the file.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time

from . import rpc
from .common import MgmtdClient, setup_logging
from .kv import open_kv
from .storage_client import StorageClient

ROOT = 1
NAME_MAX = 255
PATH_MAX = 4096
SYMLOOP_MAX = 40
R, W, X = 4, 2, 1


def E(code, msg=""):
    return rpc.RpcError(code, msg)


def ikey(i: int) -> bytes:
    return b"I" + struct.pack(">Q", i)


def skey(i: int, sid: str) -> bytes:
    return b"S" + struct.pack(">Q", i) + sid.encode()


def dkey(parent: int, name: str) -> bytes:
    return b"D" + struct.pack(">Q", parent) + name.encode()


def split_path(path) -> list[str]:
    """Validated absolute path -> components ('.' dropped, '..' folded lexically)."""
    if not isinstance(path, str):
        raise E("EINVAL", f"path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise E("EINVAL", f"path must be absolute, got {path!r}")
    if "\0" in path:
        raise E("EINVAL", "path contains a NUL byte")
    if len(path.encode()) > PATH_MAX:
        raise E("ENAMETOOLONG", f"path longer than {PATH_MAX} bytes")
    out = []
    for c in path.split("/"):
        if c in ("", "."):
            continue
        if c == "..":
            if out:
                out.pop()
            continue
        if len(c.encode()) > NAME_MAX:
            raise E("ENAMETOOLONG", f"name longer than {NAME_MAX} bytes: {c[:20]}...")
        out.append(c)
    return out


class User:
    def __init__(self, d: dict | None):
        d = d or {}
        self.uid = int(d.get("uid", 0))
        self.gid = int(d.get("gid", 0))
        self.gids = set(int(g) for g in d.get("gids", [])) | {self.gid}

    def may(self, ino: dict, want: int) -> bool:
        if self.uid == 0:
            return True
        m = ino["mode"]
        if self.uid == ino["uid"]:
            bits = (m >> 6) & 7
        elif ino["gid"] in self.gids:
            bits = (m >> 3) & 7
        else:
            bits = m & 7
        return bits & want == want

    def need(self, ino: dict, want: int, what: str):
        if not self.may(ino, want):
            raise E("EACCES", f"permission denied: {what}")


def public_attrs(ino: dict) -> dict:
    return {k: ino[k] for k in ("id", "type", "mode", "uid", "gid", "nlink", "size", "atime",
                                "mtime", "ctime", "layout") if k in ino} | (
        {"target": ino["target"]} if ino["type"] == "l" else {})


class MetaService:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.id = str(cfg["node_id"])
        self.log = setup_logging(f"meta-{self.id}")
        self.kv = open_kv(cfg["kv"])
        self.chunk_size = int(cfg.get("chunk_size", 1 << 20))
        self.stripe = int(cfg.get("stripe", 3))
        self.max_file_size = int(cfg.get("max_file_size", 1 << 40))
        self.session_timeout = float(cfg.get("session_timeout_s", 60.0))
        self.rpc = rpc.Client(cfg["secret"])
        self.mgmtd = MgmtdClient(cfg["mgmtd"], self.rpc)
        self.server = rpc.Server(cfg["listen"], cfg["secret"], self.handle, name="meta")
        self.addr = self.server.addr
        self._storage = None
        self._stop = threading.Event()
        self.kv.transact(self._init_root)

    @property
    def storage(self) -> StorageClient:
        if self._storage is None:
            self._storage = StorageClient(self.rpc, self.mgmtd, deadline_s=30.0)
        return self._storage

    def _init_root(self, t):
        if t.get(ikey(ROOT)) is None:
            now = time.time()
            t.put(ikey(ROOT), json.dumps({
                "id": ROOT, "type": "d", "mode": 0o777, "uid": 0, "gid": 0, "nlink": 2, "size": 0,
                "atime": now, "mtime": now, "ctime": now, "parent": ROOT,
                "layout": {"chunk_size": self.chunk_size, "stripe": self.stripe}}).encode())
            t.put(b"N", b"2")

    # --- KV helpers ---------------------------------------------------------------------------
    @staticmethod
    def _get(t, i: int) -> dict | None:
        raw = t.get(ikey(i))
        return json.loads(raw) if raw else None

    @staticmethod
    def _put(t, ino: dict):
        t.put(ikey(ino["id"]), json.dumps(ino).encode())

    @staticmethod
    def _new_id(t) -> int:
        n = int(t.get(b"N") or b"2")
        t.put(b"N", str(n + 1).encode())
        return n

    def _walk(self, t, comps: list[str], user: User, follow_last: bool) -> dict:
        cur = self._get(t, ROOT)
        done: list[str] = []
        hops = 0
        i = 0
        comps = list(comps)
        while i < len(comps):
            name = comps[i]
            if cur["type"] != "d":
                raise E("ENOTDIR", f"/{'/'.join(done)} is not a directory")
            user.need(cur, X, f"search /{'/'.join(done)}")
            ent = t.get(dkey(cur["id"], name))
            if ent is None:
                raise E("ENOENT", f"no such file or directory: /{'/'.join(done + [name])}")
            ino = self._get(t, json.loads(ent)["id"])
            if ino is None:
                raise E("ESTALE", "dangling directory entry")
            last = i == len(comps) - 1
            if ino["type"] == "l" and (not last or follow_last):
                hops += 1
                if hops > SYMLOOP_MAX:
                    raise E("ELOOP", "too many levels of symbolic links")
                tgt = ino["target"]
                base = [] if tgt.startswith("/") else done
                comps = split_path("/" + "/".join(base + [tgt] + comps[i + 1:]))
                cur, done, i = self._get(t, ROOT), [], 0
                continue
            cur = ino
            done.append(name)
            i += 1
        return cur

    def _parent(self, t, path, user: User) -> tuple[dict, str]:
        comps = split_path(path)
        if not comps:
            raise E("EINVAL", "the root has no parent entry")
        parent = self._walk(t, comps[:-1], user, True)
        if parent["type"] != "d":
            raise E("ENOTDIR", f"parent of {path} is not a directory")
        return parent, comps[-1]

    def _lookup(self, t, parent: dict, name: str):
        ent = t.get(dkey(parent["id"], name))
        return self._get(t, json.loads(ent)["id"]) if ent else None

    def _layout_for(self, parent: dict, ino_id: int) -> dict:
        chains = self.storage.routing.chain_ids()
        if not chains:
            self.storage.refresh(force=True)
            chains = self.storage.routing.chain_ids()
        if not chains:
            raise E("UNAVAILABLE", "no chains in the routing table")
        pl = parent.get("layout") or {}
        stripe = max(1, min(int(pl.get("stripe", self.stripe)), len(chains)))
        start = ino_id % len(chains)
        return {"chunk_size": int(pl.get("chunk_size", self.chunk_size)), "stripe": stripe,
                "chains": [chains[(start + k) % len(chains)] for k in range(stripe)]}

    def _new_inode(self, t, typ, mode, user: User, parent: dict, **extra) -> dict:
        now = time.time()
        i = self._new_id(t)
        ino = {"id": i, "type": typ, "mode": int(mode) & 0o7777, "uid": user.uid,
               "gid": user.gid, "nlink": 2 if typ == "d" else 1, "size": 0,
               "atime": now, "mtime": now, "ctime": now, **extra}
        if typ == "f":
            ino["layout"] = self._layout_for(parent, i)
            ino["sessions"] = {}
        if typ == "d":
            ino["parent"] = parent["id"]
            ino["layout"] = dict(parent.get("layout") or {})
        return ino

    def _touch(self, t, d: dict):
        d["mtime"] = d["ctime"] = time.time()
        self._put(t, d)

    def _drop_link(self, t, ino: dict):
        """nlink-1; a file with no links and no open sessions goes to garbage collection."""
        ino["nlink"] -= 1
        ino["ctime"] = time.time()
        if ino["nlink"] <= 0 and not ino.get("sessions"):
            t.delete(ikey(ino["id"]))
            if ino["type"] == "f":
                t.put(b"G" + struct.pack(">Q", ino["id"]), json.dumps(ino["layout"]).encode())
        else:
            self._put(t, ino)

    # --- operations ---------------------------------------------------------------------------
    def op_stat(self, a, user):
        follow = a.get("follow", True)
        return {"attrs": public_attrs(self.kv.transact(
            lambda t: self._walk(t, split_path(a["path"]), user, follow)))}

    def op_open(self, a, user):
        flags = set(a.get("flags", []))
        mode = int(a.get("mode", 0o644))
        if not flags <= {"read", "write", "create", "excl", "trunc", "append"}:
            raise E("EINVAL", f"unknown open flags {sorted(flags)}")
        if not flags & {"read", "write"}:
            raise E("EINVAL", "open needs 'read' and/or 'write'")
        sid = os.urandom(8).hex() if "write" in flags else None

        def txn(t):
            parent, name = self._parent(t, a["path"], user)
            ino = self._lookup(t, parent, name)
            if ino is not None and ino["type"] == "l":
                ino = self._walk(t, split_path(a["path"]), user, True)
            created = False
            if ino is None:
                if "create" not in flags:
                    raise E("ENOENT", f"no such file: {a['path']}")
                user.need(parent, W | X, f"create in {a['path']}")
                ino = self._new_inode(t, "f", mode, user, parent)
                t.put(dkey(parent["id"], name), json.dumps({"id": ino["id"]}).encode())
                self._touch(t, parent)
                created = True
            else:
                if "excl" in flags and "create" in flags:
                    raise E("EEXIST", f"file exists: {a['path']}")
                if ino["type"] == "d":
                    if "write" in flags:
                        raise E("EISDIR", f"is a directory: {a['path']}")
                    raise E("EISDIR", f"is a directory: {a['path']}")
                want = (R if "read" in flags else 0) | (W if "write" in flags else 0)
                user.need(ino, want, f"open {a['path']}")
            trunc = "trunc" in flags and not created and ino["size"] > 0 and "write" in flags
            if trunc:
                ino["size"] = 0
                ino["mtime"] = ino["ctime"] = time.time()
            if sid:
                ino.setdefault("sessions", {})[sid] = time.time()
                t.put(skey(ino["id"], sid), str(time.time()).encode())
            if created or trunc or sid:  # a read-only open of an existing file changes nothing
                self._put(t, ino)
            return ino, trunc

        ino, trunc = self.kv.transact(txn)
        if trunc:
            self._remove_chunks(ino)
        return {"attrs": public_attrs(ino), "session": sid,
                "session_timeout": self.session_timeout}

    def _remove_chunks(self, ino):
        for c in ino["layout"]["chains"]:
            self.storage.remove_inode(c, ino["id"])

    def _storage_length(self, ino) -> int:
        lay = ino["layout"]
        n = 0
        for c in lay["chains"]:
            last = self.storage.last_chunk(c, ino["id"])
            if last is not None:
                n = max(n, last[0] * lay["chunk_size"] + last[1])
        return n

    def _settle(self, a, user, close: bool):
        iid, sid = int(a["inode"]), a.get("session")
        probe = self.kv.transact(lambda t: self._get(t, iid))
        if probe is None:
            raise E("ESTALE", f"inode {iid} no longer exists")
        if sid not in probe.get("sessions", {}):
            raise E("EBADF", "not an open write session of this file")
        # a session that reports no writes skips the storage query (its hint is then 0)
        length = self._storage_length(probe) if a.get("wrote", True) else 0

        def txn(t):
            ino = self._get(t, iid)
            if ino is None:
                raise E("ESTALE", f"inode {iid} no longer exists")
            if sid not in ino.get("sessions", {}):
                raise E("EBADF", "not an open write session of this file")
            new = max(ino["size"], length, int(a.get("length_hint", 0)))
            if new != ino["size"]:
                ino["size"] = new
                ino["mtime"] = ino["ctime"] = time.time()
            if close:
                del ino["sessions"][sid]
                t.delete(skey(iid, sid))
                if ino["nlink"] <= 0 and not ino["sessions"]:
                    ino["nlink"] = 1
                    self._drop_link(t, ino)
                    return ino
            self._put(t, ino)
            return ino
        return {"attrs": public_attrs(self.kv.transact(txn))}

    def op_close(self, a, user):
        return self._settle(a, user, True)

    def op_fsync(self, a, user):
        return self._settle(a, user, False)

    def op_renew(self, a, user):
        """Renew write-session leases: a["sessions"] = [[inode, session], ...]."""
        def txn(t):
            lost = []
            for iid, sid in a["sessions"]:
                k = skey(int(iid), str(sid))
                if t.get(k) is None:
                    lost.append([iid, sid])
                else:
                    t.put(k, str(time.time()).encode())
            return lost
        return {"lost": self.kv.transact(txn)}

    def op_mkdir(self, a, user):
        def txn(t):
            parent, name = self._parent(t, a["path"], user)
            if self._lookup(t, parent, name) is not None:
                raise E("EEXIST", f"file exists: {a['path']}")
            user.need(parent, W | X, f"mkdir {a['path']}")
            ino = self._new_inode(t, "d", a.get("mode", 0o755), user, parent)
            if a.get("layout"):
                ino["layout"].update({k: int(v) for k, v in a["layout"].items()
                                      if k in ("chunk_size", "stripe")})
            self._put(t, ino)
            t.put(dkey(parent["id"], name), json.dumps({"id": ino["id"]}).encode())
            parent["nlink"] += 1
            self._touch(t, parent)
            return ino
        return {"attrs": public_attrs(self.kv.transact(txn))}

    def _remove(self, a, user, want_dir: bool):
        def txn(t):
            parent, name = self._parent(t, a["path"], user)
            ino = self._lookup(t, parent, name)
            if ino is None:
                raise E("ENOENT", f"no such file or directory: {a['path']}")
            if want_dir and ino["type"] != "d":
                raise E("ENOTDIR", f"not a directory: {a['path']}")
            if not want_dir and ino["type"] == "d":
                raise E("EISDIR", f"is a directory: {a['path']}")
            user.need(parent, W | X, f"remove {a['path']}")
            if want_dir:
                if t.scan(b"D" + struct.pack(">Q", ino["id"]), limit=1):
                    raise E("ENOTEMPTY", f"directory not empty: {a['path']}")
                t.delete(ikey(ino["id"]))
                parent["nlink"] -= 1
            else:
                self._drop_link(t, ino)
            t.delete(dkey(parent["id"], name))
            self._touch(t, parent)
        self.kv.transact(txn)
        return {}

    def op_rmdir(self, a, user):
        return self._remove(a, user, True)

    def op_unlink(self, a, user):
        return self._remove(a, user, False)

    def op_rename(self, a, user):
        def txn(t):
            sp, sn = self._parent(t, a["src"], user)
            dp, dn = self._parent(t, a["dst"], user)
            src = self._lookup(t, sp, sn)
            if src is None:
                raise E("ENOENT", f"no such file or directory: {a['src']}")
            user.need(sp, W | X, f"rename from {a['src']}")
            user.need(dp, W | X, f"rename to {a['dst']}")
            if src["type"] == "d":
                # the destination must not lie inside the source (ancestor-loop check)
                p, seen = dp, 0
                while True:
                    if p["id"] == src["id"]:
                        raise E("EINVAL", f"cannot move {a['src']} into itself")
                    if p["id"] == ROOT or seen > 4096:
                        break
                    p, seen = self._get(t, p["parent"]), seen + 1
            dst = self._lookup(t, dp, dn)
            if dst is not None:
                if dst["id"] == src["id"]:
                    return
                if src["type"] == "d":
                    if dst["type"] != "d":
                        raise E("ENOTDIR", f"not a directory: {a['dst']}")
                    if t.scan(b"D" + struct.pack(">Q", dst["id"]), limit=1):
                        raise E("ENOTEMPTY", f"directory not empty: {a['dst']}")
                    t.delete(ikey(dst["id"]))
                    dp["nlink"] -= 1
                elif dst["type"] == "d":
                    raise E("EISDIR", f"is a directory: {a['dst']}")
                else:
                    self._drop_link(t, dst)
            t.delete(dkey(sp["id"], sn))
            t.put(dkey(dp["id"], dn), json.dumps({"id": src["id"]}).encode())
            if src["type"] == "d" and sp["id"] != dp["id"]:
                src["parent"] = dp["id"]
                sp["nlink"] -= 1
                dp["nlink"] += 1
            src["ctime"] = time.time()
            self._put(t, src)
            if sp["id"] == dp["id"]:
                sp["nlink"] = dp["nlink"]
                self._touch(t, sp)
            else:
                self._touch(t, sp)
                self._touch(t, dp)
        self.kv.transact(txn)
        return {}

    def op_link(self, a, user):
        def txn(t):
            src = self._walk(t, split_path(a["src"]), user, False)
            if src["type"] == "d":
                raise E("EPERM", "hard links to directories are not allowed")
            dp, dn = self._parent(t, a["dst"], user)
            if self._lookup(t, dp, dn) is not None:
                raise E("EEXIST", f"file exists: {a['dst']}")
            user.need(dp, W | X, f"link {a['dst']}")
            src["nlink"] += 1
            src["ctime"] = time.time()
            self._put(t, src)
            t.put(dkey(dp["id"], dn), json.dumps({"id": src["id"]}).encode())
            self._touch(t, dp)
            return src
        return {"attrs": public_attrs(self.kv.transact(txn))}

    def op_symlink(self, a, user):
        target = a["target"]
        if not isinstance(target, str) or not target or len(target.encode()) > PATH_MAX:
            raise E("EINVAL", "symlink target must be a non-empty str of at most 4096 bytes")

        def txn(t):
            dp, dn = self._parent(t, a["path"], user)
            if self._lookup(t, dp, dn) is not None:
                raise E("EEXIST", f"file exists: {a['path']}")
            user.need(dp, W | X, f"symlink {a['path']}")
            ino = self._new_inode(t, "l", 0o777, user, dp, target=target)
            ino["size"] = len(target.encode())
            self._put(t, ino)
            t.put(dkey(dp["id"], dn), json.dumps({"id": ino["id"]}).encode())
            self._touch(t, dp)
            return ino
        return {"attrs": public_attrs(self.kv.transact(txn))}

    def op_readlink(self, a, user):
        ino = self.kv.transact(lambda t: self._walk(t, split_path(a["path"]), user, False))
        if ino["type"] != "l":
            raise E("EINVAL", f"not a symbolic link: {a['path']}")
        return {"target": ino["target"]}

    def op_setattr(self, a, user):
        shrink = {}

        def txn(t):
            ino = self._walk(t, split_path(a["path"]), user, a.get("follow", True))
            owner = user.uid == 0 or user.uid == ino["uid"]
            if "mode" in a:
                if not owner:
                    raise E("EPERM", "only the owner may change the mode")
                ino["mode"] = int(a["mode"]) & 0o7777
            if "uid" in a and int(a["uid"]) != ino["uid"]:
                if user.uid != 0:
                    raise E("EPERM", "only root may change the owner")
                ino["uid"] = int(a["uid"])
            if "gid" in a and int(a["gid"]) != ino["gid"]:
                if not (user.uid == 0 or (owner and int(a["gid"]) in user.gids)):
                    raise E("EPERM", "not allowed to change the group")
                ino["gid"] = int(a["gid"])
            for k in ("atime", "mtime"):
                if k in a:
                    if not owner and not user.may(ino, W):
                        raise E("EPERM", "not allowed to change times")
                    ino[k] = float(a[k])
            if "size" in a:
                size = int(a["size"])
                if ino["type"] != "f":
                    raise E("EISDIR" if ino["type"] == "d" else "EINVAL", "truncate of a non-file")
                if size < 0:
                    raise E("EINVAL", f"size must be >= 0, got {size}")
                if size > self.max_file_size:
                    raise E("EFBIG", f"size {size} exceeds the maximum file size "
                            f"{self.max_file_size}")
                user.need(ino, W, f"truncate {a['path']}")
                if size < ino["size"]:
                    shrink.update(ino=dict(ino), old=ino["size"], new=size)
                ino["size"] = size
                ino["mtime"] = time.time()
            ino["ctime"] = time.time()
            self._put(t, ino)
            return ino
        ino = self.kv.transact(txn)
        if shrink:
            self._truncate_chunks(shrink["ino"], shrink["old"], shrink["new"])
        return {"attrs": public_attrs(ino)}

    def _truncate_chunks(self, ino, old: int, new: int):
        from .chunk import chunk_id
        lay = ino["layout"]
        cs, chains = lay["chunk_size"], lay["chains"]
        if new == 0:
            self._remove_chunks(ino)
            return
        for idx in range(new // cs, (old - 1) // cs + 1):
            keep = max(0, min(cs, new - idx * cs))
            self.storage.write_chunk(chains[idx % len(chains)], chunk_id(ino["id"], idx), 0, b"",
                                     truncate_to=keep)

    def op_listdir(self, a, user):
        limit = int(a.get("limit", 1000))
        if not 0 < limit <= 100000:
            raise E("EINVAL", f"limit must be in 1..100000, got {limit}")

        def txn(t):
            d = self._walk(t, split_path(a["path"]), user, True)
            if d["type"] != "d":
                raise E("ENOTDIR", f"not a directory: {a['path']}")
            user.need(d, R, f"list {a['path']}")
            prefix = b"D" + struct.pack(">Q", d["id"])
            after = prefix + a["start_after"].encode() if a.get("start_after") else None
            rows = t.scan(prefix, after, limit + 1)
            out = []
            for k, v in rows[:limit]:
                child = self._get(t, json.loads(v)["id"])
                out.append({"name": k[len(prefix):].decode(),
                            "type": child["type"] if child else "?",
                            "id": json.loads(v)["id"]})
            return {"entries": out, "more": len(rows) > limit}
        return self.kv.transact(txn)

    def op_statfs(self, a, user):
        r = self.storage.routing.raw
        used = cap = 0
        for n in r["nodes"].values():
            for u, c in (n.get("space") or {}).values():
                used += u
                cap += c
        return {"total": cap, "used": used, "free": max(0, cap - used),
                "chains": len(r["chains"]), "max_file_size": self.max_file_size}

    def handle(self, method, args, data):
        fn = getattr(self, "op_" + method, None)
        if fn is None:
            raise E("EINVAL", f"unknown meta method {method!r}")
        try:
            return fn(args, User(args.get("user"))), None
        except (KeyError, TypeError, ValueError) as e:
            raise E("EINVAL", f"bad arguments: {e!r}")

    # --- background: heartbeat + garbage collection ----------------------------------------------
    def _expire_sessions(self):
        now = time.time()
        rows = self.kv.transact(lambda t: t.scan(b"S", limit=256))
        for k, v in rows:
            if now - float(v) > self.session_timeout:
                iid, sid = struct.unpack(">Q", k[1:9])[0], k[9:].decode()
                self.log.info("write session %s of inode %d expired; closing it", sid, iid)
                try:
                    self._settle({"inode": iid, "session": sid}, User(None), True)
                except rpc.RpcError:  # inode or session already gone
                    self.kv.transact(lambda t: t.delete(k))

    def _gc_round(self):
        self._expire_sessions()
        rows = self.kv.transact(lambda t: t.scan(b"G", limit=64))
        for k, v in rows:
            iid = struct.unpack(">Q", k[1:])[0]
            for c in json.loads(v)["chains"]:
                self.storage.remove_inode(c, iid)
            self.kv.transact(lambda t: t.delete(k))

    def _loop(self):
        next_gc = 0.0
        while not self._stop.is_set():
            try:
                res = self.mgmtd.call("heartbeat", {"node_id": self.id, "addr": self.addr,
                                                    "type": "meta"}, deadline_s=2.0)
                if "routing" in res and self._storage is not None:
                    if res["routing"]["version"] > self._storage.routing.version:
                        from .routing import Routing
                        self._storage.routing = Routing(res["routing"])
            except Exception as e:  # noqa: BLE001
                self.log.warning("heartbeat failed: %s", e)
            if time.time() >= next_gc:
                try:
                    self._gc_round()
                except Exception as e:  # noqa: BLE001
                    self.log.warning("gc round failed: %s", e)
                next_gc = time.time() + float(self.cfg.get("gc_interval_s", 0.5))
            self._stop.wait(float(self.cfg.get("heartbeat_s", 0.3)))

    def start(self):
        self.server.start()
        threading.Thread(target=self._loop, daemon=True, name="meta-loop").start()
        self.log.info("listening on %s", self.addr)
        return self

    def stop(self):
        self._stop.set()
        self.server.stop()
