"""Shared helpers of the services: config loading, logging, the mgmtd client with fail-over."""
from __future__ import annotations

import logging
import random
import sys
import threading
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore

from . import rpc


def load_config(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def setup_logging(name: str):
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")
    return logging.getLogger(name)


class MgmtdClient:
    """Calls the primary mgmtd among `addrs`, following NOT_PRIMARY hints and skipping dead ones."""

    def __init__(self, addrs: list[str], rpc_client: rpc.Client):
        if not addrs:
            raise ValueError("at least one mgmtd address is needed")
        self.addrs = list(addrs)
        self.rpc = rpc_client
        self.current = self.addrs[0]
        self._lock = threading.Lock()

    def call(self, method: str, args: dict | None = None, deadline_s: float = 15.0,
             rpc_timeout: float = 5.0):
        end = time.time() + deadline_s
        last = None
        tried = 0
        while True:
            addr = self.current
            try:
                return self.rpc.call(addr, method, args, timeout=rpc_timeout)[0]
            except rpc.RpcError as e:
                if e.code != "NOT_PRIMARY":
                    raise
                last = e
                hint = e.extra.get("primary")
                if hint and hint != addr and hint in self.addrs:
                    self.current = hint
                    continue
            except ConnectionError as e:
                if isinstance(e, rpc.AuthError):
                    raise
                last = e
            tried += 1
            i = self.addrs.index(addr) if addr in self.addrs else -1
            self.current = self.addrs[(i + 1) % len(self.addrs)]
            if time.time() > end:
                raise ConnectionError(f"no primary mgmtd reachable among {self.addrs}: {last}")
            if tried % len(self.addrs) == 0:
                time.sleep(0.05 + random.random() * 0.1)
