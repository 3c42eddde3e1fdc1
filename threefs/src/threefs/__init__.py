"""threefs: a chain-replicated distributed file system (a from-scratch re-implementation of 3FS).

Public API:
    Client                 file-system client (open/pread/pwrite/stat/listdir/mkdir/rename/...)
    LocalCluster           start a local cluster of real processes on 127.0.0.1
    ChunkEngine            the C++ chunk engine of a storage target
    crc32c                 CRC32C checksum
"""
from ._version import __version__
from .chunk import ChunkEngine, crc32c
from .client import Client, File
from .cluster import LocalCluster
from .rpc import AuthError, RpcError

__all__ = ["Client", "File", "LocalCluster", "ChunkEngine", "crc32c", "AuthError", "RpcError",
           "__version__"]
