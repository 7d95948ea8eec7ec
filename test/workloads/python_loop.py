# Ground truth for unwinding a stripped distribution binary: Debian's /usr/bin/python3 (stripped:
# no .symtab; .dynsym names its exported C API, e.g. Py_BytesMain and _PyEval_EvalFrameDefault,
# but not main) running a CPU-bound pure-Python loop. Every native stack runs from the
# interpreter's entry: ... _PyEval_EvalFrameDefault ... Py_RunMain -> Py_BytesMain -> main
# (an address in python3.11) -> libc's __libc_start_call_main / __libc_start_main -> _start.
#
# usage: /usr/bin/python3 python_loop.py SECONDS
#   prints "ready <pid>", waits for a line on stdin, loops for SECONDS of wall time, prints
#   "done loops=<N>", then idles until stdin closes.
import os
import sys
import time


def work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    print(f"ready {os.getpid()}", flush=True)
    if not sys.stdin.readline():
        return 1
    end = time.monotonic() + seconds
    loops = 0
    while time.monotonic() < end:
        work(10000)
        loops += 1
    print(f"done loops={loops}", flush=True)
    for _ in sys.stdin:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
