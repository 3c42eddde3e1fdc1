"""threefs: a chain-replicated distributed file system (a from-scratch re-implementation of 3FS)."""
from ._version import __version__
