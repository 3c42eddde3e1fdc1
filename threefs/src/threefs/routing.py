"""Read-side helpers over the routing information that mgmtd hands out."""
from __future__ import annotations

IO_STATES = ("serving", "syncing")


class Routing:
    def __init__(self, raw: dict | None = None):
        self.raw = raw or {"version": 0, "nodes": {}, "targets": {}, "chains": []}
        self.version = self.raw["version"]
        self.chains = {int(c["id"]): c for c in self.raw["chains"]}

    def chain(self, cid: int) -> dict | None:
        return self.chains.get(int(cid))

    def chain_ids(self) -> list[int]:
        return sorted(self.chains)

    def node_of(self, tid: int) -> str | None:
        return self.raw["targets"].get(str(tid))

    def addr_of(self, tid: int) -> str | None:
        n = self.raw["nodes"].get(self.node_of(tid) or "")
        return n["addr"] if n else None

    @staticmethod
    def write_list(chain: dict) -> list[dict]:
        """Targets that take writes, head first: serving ones, then the syncing one(s)."""
        return [t for t in chain["targets"] if t["state"] in IO_STATES]

    @staticmethod
    def serving(chain: dict) -> list[dict]:
        return [t for t in chain["targets"] if t["state"] == "serving"]

    def meta_addrs(self) -> list[str]:
        return sorted(n["addr"] for n in self.raw["nodes"].values()
                      if n["type"] == "meta" and n["alive"])
