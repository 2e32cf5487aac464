"""The modules of Numba's driver-layer tests (numba.cuda.tests.cudadrv) that
bfcshim runs: on the fake driver (tests/e2e/test_numba_suite.py) and on a GPU
(scripts/gpu/numba_suite.py). Each found something the fake answered wrongly
or lacked, or checks what the shim changes (memory information,
deallocation, contexts, streams, events)."""
MODULES = ["test_cuda_memory", "test_events", "test_streams", "test_context_stack",
           "test_deallocations", "test_emm_plugins", "test_cuda_driver", "test_select_device",
           "test_reset_device", "test_detect", "test_init", "test_runtime",
           "test_cuda_auto_context", "test_array_attr", "test_cuda_ndarray",
           "test_cuda_array_slicing", "test_cuda_devicerecord", "test_host_alloc",
           "test_pinned", "test_managed_alloc"]
