"""Paths: any POSIX path, and ``threefs://`` paths.

A ``threefs://a/b`` path maps to ``<mount>/a/b`` when a threefs mount point is configured
(``threefs_mount=`` or ``SP_THREEFS_MOUNT``). Otherwise it goes through the threefs client
(``threefs.Client``, imported only if installed): inputs are fetched into the job's local cache,
outputs are written locally, uploaded into a temporary folder and renamed into place.
The client needs: open(path, mode), listdir(path), mkdir(path), rename(src, dst), stat(path).
"""
from __future__ import annotations

import fnmatch
import os
import posixpath
import shutil
from typing import List, Optional

SCHEME = "threefs://"
CHUNK = 8 << 20


def is_threefs(path: str) -> bool:
    return isinstance(path, str) and path.startswith(SCHEME)


def threefs_relpath(path: str) -> str:
    return "/" + path[len(SCHEME):].lstrip("/")


def make_client(options: Optional[dict]):
    """Create a ``threefs.Client(**options)`` if the package is installed; None otherwise.

    Without ``options``, SP_THREEFS_MGMTD and SP_THREEFS_SECRET give (mgmtd, secret).
    """
    if options is None:
        mgmtd, secret = os.environ.get("SP_THREEFS_MGMTD"), os.environ.get("SP_THREEFS_SECRET")
        if not mgmtd:
            return None
        options = {"mgmtd": [a for a in mgmtd.split(",") if a], "secret": secret}
    try:
        import threefs  # optional: developed separately
    except ImportError:
        return None
    cls = getattr(threefs, "Client", None)
    return cls(**options) if cls is not None else None


class Storage:
    def __init__(self, cache_dir: str, mount: Optional[str] = None, client=None,
                 client_options: Optional[dict] = None) -> None:
        self.cache_dir = cache_dir
        self.mount = mount
        self.client = client
        self.client_options = client_options

    def _need_client(self, path: str):
        if self.client is None and not self.mount:
            self.client = make_client(self.client_options)  # created on first use only
        if self.client is None:
            raise ValueError(f"path {path!r}: threefs:// needs the threefs client (pip install threefs, and pass "
                             "threefs_options=... or threefs_client=...) or a mount point (threefs_mount=... or "
                             "SP_THREEFS_MOUNT)")
        return self.client

    def local_input(self, path: str) -> List[str]:
        """Local path(s) for an input path or glob."""
        if not is_threefs(path):
            return [path]
        rel = threefs_relpath(path)
        if self.mount:
            return [os.path.join(self.mount, rel.lstrip("/"))]
        client = self._need_client(path)
        matches = self._glob(client, rel)
        if not matches:
            raise FileNotFoundError(f"threefs: no file found at {path!r}")
        out = []
        for m in matches:
            local = os.path.join(self.cache_dir, "threefs", m.lstrip("/"))
            if not os.path.exists(local):
                os.makedirs(os.path.dirname(local), exist_ok=True)
                tmp = local + ".part"
                with client.open(m, "rb") as src, open(tmp, "wb") as dst:
                    while True:
                        buf = src.read(CHUNK)
                        if not buf:
                            break
                        dst.write(buf)
                os.replace(tmp, local)
            out.append(local)
        return out

    def _glob(self, client, rel: str) -> List[str]:
        d, pattern = posixpath.split(rel)
        if not any(c in pattern for c in "*?["):
            try:
                client.stat(rel)
            except Exception:
                return []
            return [rel]
        return sorted(posixpath.join(d, n) for n in client.listdir(d) if fnmatch.fnmatch(n, pattern))

    def output_target(self, path: str) -> str:
        """Where a sink should stage and place its files (a local path)."""
        if not is_threefs(path):
            return path
        if self.mount:
            return os.path.join(self.mount, threefs_relpath(path).lstrip("/"))
        self._need_client(path)
        return os.path.join(self.cache_dir, "threefs-out", threefs_relpath(path).lstrip("/"))

    def publish(self, path: str, local_dir: str, names: List[str]) -> List[str]:
        """Upload files of a finished local output to threefs (client mode); returns their threefs paths."""
        if not is_threefs(path) or self.mount:
            return [os.path.join(local_dir, n) for n in names]
        client = self._need_client(path)
        dest = threefs_relpath(path)
        tmp = dest.rstrip("/") + ".__tmp"
        (client.makedirs(tmp) if hasattr(client, "makedirs") else client.mkdir(tmp))
        for n in names:
            with open(os.path.join(local_dir, n), "rb") as src, client.open(posixpath.join(tmp, n), "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
        client.rename(tmp, dest)
        return [SCHEME + posixpath.join(dest, n).lstrip("/") for n in names]
