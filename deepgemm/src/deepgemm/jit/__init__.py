"""Run-time compilation (compiler.py), driver launch (runtime.py) and the SM90 kernels' host side
(kernels.py). Imported lazily: nothing here runs on a machine without CUDA."""
