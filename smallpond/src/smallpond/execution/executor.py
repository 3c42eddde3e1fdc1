"""Executors run a list of tasks and return their results, retrying failed tasks up to a bound.

LocalExecutor: a process pool on this machine (the default; no services).
RayExecutor:   Ray tasks on a cluster (``ray_address``); the data root must be shared storage.
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
import sys
from contextlib import contextmanager
from multiprocessing.connection import wait as mp_wait
from typing import Callable, List, Optional

from .task import Task, TaskError, TaskResult, run_task


class Executor:
    def __init__(self, max_retries: int = 2) -> None:
        self.max_retries = max_retries

    def _retry_or_raise(self, task: Task, attempts: int, err: BaseException) -> None:
        fatal = isinstance(err, TaskError) and err.fatal
        if fatal or attempts > self.max_retries:
            if isinstance(err, TaskError):
                msg = str(err) if fatal else f"{err} (gave up after {attempts} attempts)"
                raise TaskError(msg, fatal) from None
            raise TaskError(f"{task.node} partition {task.partition} of {task.npartitions} failed after "
                            f"{attempts} attempt(s): {type(err).__name__}: {err}") from None

    def run(self, tasks: List[Task], on_done: Optional[Callable[[TaskResult], None]] = None) -> List[TaskResult]:
        raise NotImplementedError

    def shutdown(self) -> None:
        pass


class LocalExecutor(Executor):
    """Runs tasks in ``num_executors`` worker processes on this machine.

    Workers are spawned once per session and reused across stages. They are started without
    re-running the user's ``__main__`` script (no ``if __name__ == "__main__"`` guard needed);
    a worker that dies (killed, out of memory) is replaced and its task retried.
    """

    def __init__(self, num_executors: int, max_retries: int = 2) -> None:
        super().__init__(max_retries)
        self.num_executors = num_executors
        self._workers: List[_Worker] = []

    def start(self) -> None:
        """Start the workers now (they warm up while the driver builds the plan)."""
        self._ensure_workers()

    def _ensure_workers(self) -> None:
        alive = [w for w in self._workers if w.proc.is_alive()]
        for w in self._workers:
            if w not in alive:
                w.close()
        self._workers = alive
        while len(self._workers) < self.num_executors:
            self._workers.append(_Worker())

    def run(self, tasks, on_done=None):
        results: List[Optional[TaskResult]] = [None] * len(tasks)
        attempts = [0] * len(tasks)
        queue = list(range(len(tasks)))
        busy: dict = {}  # worker -> task index
        try:
            while queue or busy:
                self._ensure_workers()
                for w in self._workers:
                    if w.ready and w not in busy and queue:
                        i = queue.pop(0)
                        attempts[i] += 1
                        w.conn.send(tasks[i])
                        busy[w] = i
                starting = [w for w in self._workers if not w.ready]
                handles = [h for w in list(busy) + starting for h in (w.conn, w.proc.sentinel)]
                ready = set(mp_wait(handles))
                for w in starting:  # a worker takes tasks once it has warmed up
                    if w.conn in ready:
                        try:
                            w.conn.recv()
                            w.ready = True
                        except (EOFError, OSError):
                            w.close()
                    elif w.proc.sentinel in ready:
                        w.close()
                for w in list(busy):
                    if w.conn in ready:
                        i = busy.pop(w)
                        try:
                            status, payload = w.conn.recv()
                        except (EOFError, OSError):
                            status, payload = "died", None
                    elif w.proc.sentinel in ready:
                        i = busy.pop(w)
                        status, payload = "died", None
                    else:
                        continue
                    if status == "ok":
                        payload.attempts = attempts[i]
                        results[i] = payload
                        if on_done:
                            on_done(payload)
                        continue
                    if status == "died":
                        w.close()
                        payload = RuntimeError(f"worker process exited with code {w.proc.exitcode}")
                    self._retry_or_raise(tasks[i], attempts[i], payload)
                    queue.append(i)
        except BaseException:
            for w in busy:  # abandon running tasks: their workers are replaced
                w.close()
            raise
        return results

    def shutdown(self) -> None:
        for w in self._workers:
            w.close(graceful=True)
        self._workers = []


@contextmanager
def _main_hidden():
    """Hide __main__'s file from multiprocessing so spawned workers do not re-import it."""
    main = sys.modules.get("__main__")
    saved = {a: getattr(main, a) for a in ("__file__", "__spec__") if main is not None and hasattr(main, a)}
    try:
        if main is not None:
            main.__spec__ = None
            if "__file__" in saved:
                del main.__file__
        yield
    finally:
        for a, v in saved.items():
            setattr(main, a, v)


def _warm_up() -> None:
    """Pay one-off costs (imports, DuckDB start-up) before the first task arrives."""
    import duckdb
    import pandas  # noqa: F401  (pyarrow imports it lazily on first numpy conversion)
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    from . import shuffle  # noqa: F401
    con = duckdb.connect(config={"threads": 1})
    try:
        con.execute("select i % 7 as k, sum(i) from range(1000) t(i) group by k").fetchall()
    finally:
        con.close()
    pa.array(__import__("numpy").arange(4))


def _worker_main(conn) -> None:
    try:
        _warm_up()
    except Exception:  # never fatal: tasks import what they need anyway
        pass
    try:
        conn.send(("ready", None))
    except (EOFError, OSError):
        return
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if task is None:
            return
        try:
            reply = ("ok", run_task(task))
        except BaseException as e:  # send every failure back; the driver decides about retries
            try:
                pickle.dumps(e)
                reply = ("err", e)
            except Exception:
                reply = ("err", RuntimeError(f"{type(e).__name__}: {e}"))
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


class _Worker:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.ready = False
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), name="smallpond-worker")
        with _main_hidden():
            self.proc.start()
        child.close()

    def close(self, graceful: bool = False) -> None:
        if graceful and self.proc.is_alive():
            try:
                self.conn.send(None)
            except (OSError, EOFError):
                pass
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


class RayExecutor(Executor):
    """Runs each task as a Ray task (``num_cpus`` = the task's threads) on the cluster at ``address``."""

    def __init__(self, address: str, max_retries: int = 2) -> None:
        super().__init__(max_retries)
        try:
            import ray
        except ImportError:
            raise ImportError("ray_address was given but ray is not installed: pip install 'ray>=2.9'") from None
        self.ray = ray
        if not ray.is_initialized():
            kwargs = {}
            host = address.rsplit(":", 1)[0]
            if host in ("127.0.0.1", "localhost"):  # a local head: stay on loopback
                kwargs["_node_ip_address"] = "127.0.0.1"
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False, **kwargs)
        self._remote = ray.remote(max_retries=0)(run_task)

    def run(self, tasks, on_done=None):
        ray = self.ray
        results: List[Optional[TaskResult]] = [None] * len(tasks)
        attempts = [0] * len(tasks)
        pending = {}

        def submit(i):
            attempts[i] += 1
            ref = self._remote.options(num_cpus=1).remote(tasks[i])
            pending[ref] = i

        for i in range(len(tasks)):
            submit(i)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        r = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        cause = getattr(e, "cause", None) or e
                        self._retry_or_raise(tasks[i], attempts[i], cause)
                        submit(i)
                        continue
                    except ray.exceptions.RayError as e:  # worker or node died
                        self._retry_or_raise(tasks[i], attempts[i], e)
                        submit(i)
                        continue
                    r.attempts = attempts[i]
                    results[i] = r
                    if on_done:
                        on_done(r)
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise
        return results

    def shutdown(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()
