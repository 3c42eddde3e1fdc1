"""`python -m threefs`: a local 3-node, 3-replica cluster in a temporary directory; write and
read a file, kill -9 one storage node, read again, restart it, watch its targets go back to
serving, shut down. The last line is the ci/demo summary."""
from __future__ import annotations

import hashlib
import os
import signal
import tempfile
import time

from .cli import print_status
from .cluster import LocalCluster


def _states(st, node):
    return sorted({t["state"] for c in st["chains"] for t in c["targets"]
                   if st["targets"][str(t["id"])] == node})


def run_demo() -> int:
    ok = False
    with tempfile.TemporaryDirectory(prefix="threefs-demo-") as d:
        t0 = time.time()
        cl = LocalCluster(d, storage_nodes=3, replicas=3, heartbeat_timeout_s=1.5)
        cl.start()
        try:
            print(f"cluster up in {time.time() - t0:.1f}s at {d}")
            print_status(cl.status())
            fs = cl.client(uid=0, gid=0, deadline_s=60)
            data = os.urandom(8 << 20)
            digest = hashlib.sha256(data).hexdigest()[:16]
            t = time.time()
            with fs.open("/demo.bin", "wb") as f:
                f.write(data)
            wt = time.time() - t
            t = time.time()
            with fs.open("/demo.bin", "rb") as f:
                back = f.read()
            rt = time.time() - t
            same1 = back == data
            print(f"wrote 8 MiB ({8 / wt:.0f} MiB/s) and read it back ({8 / rt:.0f} MiB/s): "
                  f"sha256 {digest} {'matches' if same1 else 'DIFFERS'}")
            cl.kill("s1", signal.SIGKILL)
            print("killed storage node s1 with SIGKILL")
            end = time.time() + 30
            while time.time() < end and _states(cl.status(), "s1") != ["offline"]:
                time.sleep(0.1)
            print(f"s1 targets now: {_states(cl.status(), 's1')}")
            same2 = fs.pread("/demo.bin", len(data), 0) == data
            print(f"read with s1 down: {'intact' if same2 else 'DIFFERS'}")
            cl.start_process("s1")
            print("restarted s1")
            seen = []
            end = time.time() + 60
            while time.time() < end:
                s = _states(cl.status(), "s1")
                if not seen or seen[-1] != s:
                    seen.append(s)
                if s == ["serving"]:
                    break
                time.sleep(0.05)
            print("s1 target states seen: " + " -> ".join("/".join(s) for s in seen))
            st = cl.wait_serving(30)
            print_status(st)
            same3 = fs.pread("/demo.bin", len(data), 0) == data
            print(f"read after recovery: {'intact' if same3 else 'DIFFERS'}")
            fs.close()
            ok = same1 and same2 and same3
        finally:
            cl.stop()
            print("cluster shut down")
    print(f"summary: backend=CPU result={'chain recovered, no data lost' if ok else 'FAILED'}")
    return 0 if ok else 1
