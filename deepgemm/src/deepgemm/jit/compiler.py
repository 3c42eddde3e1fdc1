"""Run-time compilation of the CUDA kernels in deepgemm/include to cubins, with a disk cache.

Cache: $DEEPGEMM_CACHE_DIR or ~/.cache/deepgemm, one file `<sha256>.cubin` (+ `.json` metadata)
per kernel, keyed by a hash of the full source, the compiler options, the target arch and the
compiler's identity. Writes go to a temporary file in the same folder, then os.replace (atomic on
POSIX), so concurrent processes never see a partial cubin; an fcntl lock per key lets one process
compile while the others wait and then read its result. Thread-safe within a process."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"
ARCH = "sm_90a"
NVCC_FLAGS = ("-std=c++17", "-O3", "--use_fast_math", "-Xptxas", "-v")
NVRTC_FLAGS = ("-std=c++17", "-default-device", "--use_fast_math", "--ptxas-options=-v")


@dataclass
class CompileRecord:
    """One kernel as obtained by the JIT: where from, how long, and ptxas' resource report."""
    name: str
    key: str
    backend: str  # "nvcc", "nvrtc" or "cache"
    seconds: float
    ptxas: str = ""
    params: dict = field(default_factory=dict)


COMPILE_LOG: list[CompileRecord] = []
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def cache_dir() -> Path:
    d = os.environ.get("DEEPGEMM_CACHE_DIR")
    return Path(d).expanduser() if d else Path.home() / ".cache" / "deepgemm"


def read_header(name: str = "deepgemm/sm90_gemm.cuh") -> str:
    return (INCLUDE_DIR / name).read_text()


def nvcc_path() -> str | None:
    cand = os.environ.get("DEEPGEMM_NVCC")
    if cand:
        return cand
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return None


def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # type: ignore
        return nvrtc
    except Exception:  # noqa: BLE001 - cuda-bindings missing or without libnvrtc
        return None


def choose_backend() -> str:
    """DEEPGEMM_JIT_BACKEND=nvrtc|nvcc forces one; default: NVRTC if importable, else nvcc."""
    forced = os.environ.get("DEEPGEMM_JIT_BACKEND", "").lower()
    if forced in ("nvrtc", "nvcc"):
        return forced
    if _nvrtc() is not None:
        return "nvrtc"
    if nvcc_path() is not None:
        return "nvcc"
    raise RuntimeError("deepgemm: no CUDA compiler: install cuda-bindings (NVRTC) or put nvcc on PATH")


def compiler_identity(backend: str) -> str:
    if backend == "nvcc":
        out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True).stdout
        return "nvcc:" + out.strip().splitlines()[-1]
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc:{major}.{minor}"


def cache_key(source: str, backend: str, identity: str, arch: str = ARCH) -> str:
    flags = NVCC_FLAGS if backend == "nvcc" else NVRTC_FLAGS
    h = hashlib.sha256()
    for part in (source, " ".join(flags), arch, identity):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write data to path via a temporary file in the same folder and os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def compile_nvcc(source: str, arch: str = ARCH) -> tuple[bytes, str]:
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("deepgemm: nvcc not found (set DEEPGEMM_NVCC or CUDA_HOME)")
    code = arch.replace("sm_", "")
    with tempfile.TemporaryDirectory(prefix="deepgemm-") as tmp:
        src, out = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
        Path(src).write_text(source)
        cmd = [nvcc, "-cubin", *NVCC_FLAGS, f"-gencode=arch=compute_{code},code=sm_{code}", "-o", out, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"deepgemm: nvcc failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
        return Path(out).read_bytes(), proc.stderr


def compile_nvrtc(source: str, arch: str = ARCH) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    if nvrtc is None:
        raise RuntimeError("deepgemm: cuda.bindings.nvrtc is not importable")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"deepgemm_kernel.cu", 0, [], [])
    _nvrtc_check(nvrtc, err, "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), *(f.encode() for f in NVRTC_FLAGS)]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_s = log.decode(errors="replace").rstrip("\0 ")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"deepgemm: NVRTC failed ({err}):\n{log_s[-4000:]}")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _nvrtc_check(nvrtc, err, "nvrtcGetCUBIN")
        return bytes(cubin), log_s
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_check(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"deepgemm: {what} failed: {err}")


def _key_lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def build(name: str, source: str, params: dict | None = None, backend: str | None = None,
          compile_fn=None) -> tuple[bytes, CompileRecord]:
    """Return the cubin of `source`, from the disk cache or by compiling (and caching) it.

    compile_fn(source) -> (cubin, log) replaces the compiler (tests of the cache logic)."""
    backend = backend or choose_backend()
    identity = compiler_identity(backend) if compile_fn is None else "custom"
    key = cache_key(source, backend, identity)
    root = cache_dir()
    path, meta = root / f"{key}.cubin", root / f"{key}.json"
    with _key_lock(key):
        if path.exists():
            rec = CompileRecord(name, key, "cache", 0.0, ptxas=_cached_ptxas(meta), params=dict(params or {}))
            COMPILE_LOG.append(rec)
            return path.read_bytes(), rec
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be compiling the same kernel
            try:
                if path.exists():
                    rec = CompileRecord(name, key, "cache", 0.0, ptxas=_cached_ptxas(meta), params=dict(params or {}))
                    COMPILE_LOG.append(rec)
                    return path.read_bytes(), rec
                fn = compile_fn or (compile_nvcc if backend == "nvcc" else compile_nvrtc)
                t0 = time.perf_counter()
                cubin, log = fn(source)
                secs = time.perf_counter() - t0
                rec = CompileRecord(name, key, backend if compile_fn is None else "custom", secs,
                                    ptxas=_ptxas_summary(log), params=dict(params or {}))
                atomic_write(meta, json.dumps({"name": name, "backend": rec.backend, "seconds": secs,
                                               "ptxas": rec.ptxas, "params": rec.params}).encode())
                atomic_write(path, cubin)
                COMPILE_LOG.append(rec)
                return cubin, rec
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _cached_ptxas(meta: Path) -> str:
    """ptxas' report stored beside a cached cubin ("" if the metadata is missing or unreadable)."""
    try:
        return json.loads(meta.read_text()).get("ptxas", "")
    except (OSError, ValueError):
        return ""


def spills(ptxas: str) -> bool:
    """True if ptxas' report shows spill stores/loads or a stack frame."""
    return any(int(v) for v in re.findall(r"(\d+) bytes (?:spill stores|spill loads|stack frame)", ptxas))


def _ptxas_summary(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln or "C75" in ln]
    return " | ".join(lines)[-600:]
