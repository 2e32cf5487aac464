#!/usr/bin/env python3
"""test_torch_stub.py LIBBFCSHIM FAKE_CUDA_DIR WORKDIR - bfcshim.torch's
wiring of Tensor.record_stream, over a stand-in for PyTorch (torch_stub/;
real PyTorch needs the real CUDA runtime): install() hands PyTorch's
pluggable allocator bfcshim_torch_record_stream through
set_record_stream_fn where the allocator has it, and where it has not, warns
once that record_stream is not honoured and what to do. What the library
then does with a record is e2e_api torch-record-stream's."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, fake_dir, work = sys.argv[1:4]
testcheck.fresh_dir(work)
check = testcheck.Checks()
log = os.path.join(work, "plugin.log")
env = testcheck.fake_cuda_env(fake_dir, BFCSHIM_LIBRARY=lib, BFCSHIM_LOG_FILE=log,
                              PYTHONPATH=os.pathsep.join([os.path.join(here, "torch_stub"),
                                                          os.path.join(here, "..", "..",
                                                                       "python")]))
script = """
import ctypes, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    import bfcshim.torch, torch
    bfcshim.torch.install()
    bfcshim.torch.install()
    a = bfcshim.torch.allocator()
native = a.allocator()
said = [str(x.message) for x in w if "record_stream" in str(x.message)]
print("warnings", len(said))
for m in said:
    print("warning:", m)
if native.record_stream is not None:
    # a pointer that is no block: the library logs it and does nothing else
    native.record_stream(0x1000, None)
    print("called")
"""
p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                   timeout=300)
check(p.returncode == 0 and "warnings 0" in p.stdout and "called" in p.stdout,
      f"set_record_stream_fn given the library's function, no warning: {p.returncode} "
      f"{p.stdout} {p.stderr[-2000:]}")
text = open(log).read() if os.path.exists(log) else ""
check("bfcshim_torch_record_stream(0x1000" in text and "ignored" in text,
      f"PyTorch's record_stream call reached the library: {text[-1000:]}")

p = subprocess.run([sys.executable, "-c", script], env=dict(env, TORCH_STUB_NO_RECORD_STREAM="1"),
                   capture_output=True, text=True, timeout=300)
check(p.returncode == 0 and "warnings 1" in p.stdout and "not honoured" in p.stdout
      and "wait_stream" in p.stdout and "called" not in p.stdout,
      f"without set_record_stream_fn, one warning saying what to do: {p.returncode} "
      f"{p.stdout} {p.stderr[-2000:]}")
check.finish()
