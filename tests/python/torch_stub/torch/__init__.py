"""A stand-in for PyTorch, just enough of torch.cuda.memory for
bfcshim.torch's wiring (test_torch_plugin.py): real PyTorch needs the real
CUDA runtime. TORCH_STUB_NO_RECORD_STREAM=1 makes its allocator lack
set_record_stream_fn, as builds before it was bound do."""
from . import cuda  # noqa: F401

__version__ = "0.0-stub"
