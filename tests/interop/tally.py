"""What the interop checks share: their arguments (the C++ tool, a scratch directory made empty) and the tally
they end with ("N passed, M failed"; exit 1 on any failure)."""
import pathlib
import shutil
import sys

passed = failed = 0


def arguments():
    tool, work = sys.argv[1], pathlib.Path(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return tool, work


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAILED: {what}", flush=True)


def finish():
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
