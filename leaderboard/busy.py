"""Processes that keep CPU cores busy while a benchmark runs (``bench_leaderboard --busy N``):
the refresh measured as it runs on a machine where other work holds cores. No Django.

Each spinner is a process of its own (spawned: a fresh interpreter, nothing of the parent's
state), started before the measured run and spinning in a pure-Python loop until it is ended
after it; the operating system spreads them over the cores the benchmark runs on.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

READY_TIMEOUT = 60.0  # Seconds a spinner may take to start (a fresh interpreter).


def _spin(ready: Any) -> None:
    ready.release()
    while True:
        pass


@dataclass
class Spinners:
    """The spinners of one ``busy_cores`` block: their process ids and, once it ended, the CPU
    seconds each used (from /proc; None where the system has none)."""

    pids: list[int]
    cpu_seconds: list[float | None] = field(default_factory=list)


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a running process, from /proc/<pid>/stat (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def busy_cores(processes: int) -> Iterator[Spinners]:
    """``processes`` spinning processes for the duration of the block: all started and spinning
    when it begins, ended when it ends."""
    if processes <= 0:
        yield Spinners([])
        return
    context = multiprocessing.get_context("spawn")
    ready = context.Semaphore(0)
    spinners = [context.Process(target=_spin, args=(ready,), daemon=True) for _ in range(processes)]
    for spinner in spinners:
        spinner.start()
    result = Spinners([spinner.pid or 0 for spinner in spinners])
    try:
        for _ in spinners:
            if not ready.acquire(timeout=READY_TIMEOUT):
                raise RuntimeError(f"A spinner did not start within {READY_TIMEOUT:.0f} s.")
        yield result
        result.cpu_seconds = [_cpu_seconds(pid) for pid in result.pids]
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join()
