#!/usr/bin/env python3
"""numba_suite_runner.py OUT.json MODULE... - runs Numba's own CUDA driver
tests (numba.cuda.tests.cudadrv.MODULE) in this process and writes each
test's outcome to OUT.json: {"tests": [{"id", "outcome", "reason"}]}, where
outcome is ok, skip, error or fail and reason is the exception's last line
(or a missing entry point's, or the skip message). Run by test_numba_suite.py against the fake
driver, alone and under the shim; a crash leaves OUT.json unwritten."""
import json
import sys
import traceback
import unittest


class Recorder(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.rows = []

    def _row(self, test, outcome, reason=""):
        self.rows.append({"id": test.id(), "outcome": outcome, "reason": reason})

    @staticmethod
    def _last_line(err):
        # An entry point the driver lacks is the root cause wherever it
        # appears in the chain (cuda.core reports it as a SystemError).
        lines = "".join(traceback.format_exception(*err)).strip().splitlines()
        missing = [l for l in lines if "FunctionNotFoundError" in l]
        return (missing or lines or [""])[-1].strip()

    @staticmethod
    def _is_skip(err):
        # unittest's, or pytest's (importorskip raises _pytest's Skipped).
        return issubclass(err[0], unittest.SkipTest) or err[0].__name__ == "Skipped"

    def addSuccess(self, test):
        self._row(test, "ok")

    def addSkip(self, test, reason):
        self._row(test, "skip", reason)

    def addError(self, test, err):
        if self._is_skip(err):
            self._row(test, "skip", str(err[1]))
        else:
            self._row(test, "error", self._last_line(err))

    def addFailure(self, test, err):
        self._row(test, "fail", self._last_line(err))

    def addSubTest(self, test, subtest, err):
        if err is not None and self._is_skip(err):
            self._row(subtest, "skip", str(err[1]))
        elif err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._row(subtest, kind, self._last_line(err))

    def addExpectedFailure(self, test, err):
        self._row(test, "ok", "expected failure")

    def addUnexpectedSuccess(self, test):
        self._row(test, "fail", "unexpected success")


def main():
    out, modules = sys.argv[1], sys.argv[2:]
    suite = unittest.defaultTestLoader.loadTestsFromNames(
        [f"numba.cuda.tests.cudadrv.{m}" for m in modules])
    result = Recorder()
    suite.run(result)
    with open(out, "w") as f:
        json.dump({"tests": result.rows}, f, indent=1)


# Some tests start processes with multiprocessing's "spawn", which imports
# this file again in the child: only the parent runs the suite.
if __name__ == "__main__":
    main()
