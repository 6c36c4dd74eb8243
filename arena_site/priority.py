"""Lowering a process's CPU priority, every thread of it (Linux keeps one nice value and one
scheduling policy per thread)."""

import os
from pathlib import Path

TASKS = Path("/proc/self/task")


def lower_priority(increment: int, *, idle: bool = False) -> int:
    """Raise the nice value of every thread of this process by ``increment``, and with ``idle``
    give them Linux's SCHED_IDLE policy too (they then run only when no other task wants the
    core). Lowering one's own priority needs no privilege; threads started later inherit their
    creator's. Processes started before keep theirs. Returns how many threads were changed."""
    if increment <= 0 and not idle:
        return 0
    if not TASKS.is_dir():  # Not Linux: one nice value for the whole process, no SCHED_IDLE.
        os.nice(max(increment, 0))
        return 1
    changed = 0
    for task in TASKS.iterdir():
        thread_id = int(task.name)
        try:
            if increment > 0:
                current = os.getpriority(os.PRIO_PROCESS, thread_id)
                os.setpriority(os.PRIO_PROCESS, thread_id, min(current + increment, 19))
            if idle:
                os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:  # The thread ended meanwhile.
            continue
        changed += 1
    return changed
