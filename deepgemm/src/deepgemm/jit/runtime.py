"""Loading cubins and launching them through the CUDA driver API (libcuda via ctypes).

Kernels run on torch's current stream (so they compose with CUDA graphs and torch's stream
semantics); tensor maps (TMA descriptors) are encoded here and passed by value as 128-byte
kernel parameters."""
from __future__ import annotations

import ctypes
import threading

import torch

_lib = None
_lib_guard = threading.Lock()

# CUtensorMapDataType / swizzle values of cuda.h
DT_UINT8, DT_FLOAT32, DT_BFLOAT16 = 0, 7, 9
SWIZZLE_NONE, SWIZZLE_128B = 0, 3
L2_PROMO_256B = 3
MAX_DYNAMIC_SMEM_ATTR = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def lib():
    global _lib
    with _lib_guard:
        if _lib is None:
            cu = ctypes.CDLL("libcuda.so.1")
            cu.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            cu.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
            cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
            cu.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
            cu.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_void_p]
            cu.cuTensorMapEncodeTiled.argtypes = [
                ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            _lib = cu
    return _lib


def check(err: int, what: str) -> None:
    if err != 0:
        msg = ctypes.c_char_p()
        lib().cuGetErrorString(err, ctypes.byref(msg))
        raise RuntimeError(f"deepgemm: {what} failed: CUDA error {err} ({(msg.value or b'?').decode()})")


class Kernel:
    """A loaded `extern "C"` kernel of a cubin (one module per device)."""

    def __init__(self, cubin: bytes, name: str, smem_bytes: int):
        torch.cuda.current_device()  # make sure torch's primary context is current
        self.cubin, self.name, self.smem = cubin, name, smem_bytes
        self._funcs: dict[int, ctypes.c_void_p] = {}
        self._keep: list = []

    def func(self, device: int):
        f = self._funcs.get(device)
        if f is None:
            cu = lib()
            with torch.cuda.device(device):
                if not torch.cuda.is_current_stream_capturing():  # (a capturing thread has it current already)
                    torch.cuda.synchronize(device)  # makes torch's primary context current on this thread
                mod = ctypes.c_void_p()
                check(cu.cuModuleLoadData(ctypes.byref(mod), self.cubin), "cuModuleLoadData")
                f = ctypes.c_void_p()
                check(cu.cuModuleGetFunction(ctypes.byref(f), mod, self.name.encode()), "cuModuleGetFunction")
                check(cu.cuFuncSetAttribute(f, MAX_DYNAMIC_SMEM_ATTR, self.smem), "cuFuncSetAttribute")
            self._keep.append(mod)
            self._funcs[device] = f
        return f

    def launch(self, device: int, grid: int, threads: int, args: list, pdl: bool = False) -> None:
        """args: ctypes objects in the kernel's parameter order. pdl: launch as a programmatic dependent of the
        stream's previous kernel (the kernel must wait in griddepcontrol.wait before touching global memory)."""
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        stream = torch.cuda.current_stream(device).cuda_stream
        attr = LaunchAttribute(id=ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1
        cfg = LaunchConfig((grid, 1, 1), (threads, 1, 1), self.smem, ctypes.c_void_p(stream), ctypes.pointer(attr),
                           int(pdl))  # 0 attributes: an ordinary stream-ordered launch
        check(lib().cuLaunchKernelEx(ctypes.byref(cfg), self.func(device), ptrs, None), f"cuLaunchKernelEx({self.name})")


class TmaDesc(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 16)]
    _pack_ = 1


_tmap_cache: dict[tuple, TmaDesc] = {}


def tensor_map_2d(ptr: int, dtype: int, inner: int, outer: int, row_stride_bytes: int,
                  box_inner: int, box_outer: int, swizzle: int) -> TmaDesc:
    """2-D tiled tensor map over a row-major [outer, inner] view starting at ptr (zero fill
    outside the bounds). Cached by its arguments (the encode is a pure function of them)."""
    key = (ptr, dtype, inner, outer, row_stride_bytes, box_inner, box_outer, swizzle)
    desc = _tmap_cache.get(key)
    if desc is not None:
        return desc
    desc = TmaDesc()
    dims = (ctypes.c_uint64 * 2)(inner, outer)
    strides = (ctypes.c_uint64 * 1)(row_stride_bytes)
    box = (ctypes.c_uint32 * 2)(box_inner, box_outer)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    err = lib().cuTensorMapEncodeTiled(ctypes.byref(desc), dtype, 2, ctypes.c_void_p(ptr), dims, strides, box, estr,
                                       0, swizzle, L2_PROMO_256B, 0)
    check(err, f"cuTensorMapEncodeTiled(inner={inner}, outer={outer}, stride={row_stride_bytes}, "
               f"box=({box_inner}, {box_outer}))")
    if len(_tmap_cache) > 4096:
        _tmap_cache.clear()
    _tmap_cache[key] = desc
    return desc
