"""A stand-in for CuPy (which needs the real CUDA runtime, so cannot run on
the fake driver): just what bfcshim.cupy touches, its streams made on the
driver that the test opened. Used by test_cupy_plugin.py only."""
from . import cuda  # noqa: F401
