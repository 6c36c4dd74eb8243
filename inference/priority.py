"""Lowering a process's CPU priority, every thread of it (Linux keeps one nice value per thread)."""

import os
from pathlib import Path

TASKS = Path("/proc/self/task")


def lower_priority(increment: int) -> int:
    """Raise the nice value of every thread of this process by ``increment`` (no privilege is
    needed to lower one's own priority). Threads started later inherit their creator's value.
    Returns how many threads were changed."""
    if increment <= 0:
        return 0
    if not TASKS.is_dir():  # Not Linux: one value for the whole process.
        os.nice(increment)
        return 1
    changed = 0
    for task in TASKS.iterdir():
        thread_id = int(task.name)
        try:
            current = os.getpriority(os.PRIO_PROCESS, thread_id)
            os.setpriority(os.PRIO_PROCESS, thread_id, min(current + increment, 19))
        except ProcessLookupError:  # The thread ended meanwhile.
            continue
        changed += 1
    return changed
