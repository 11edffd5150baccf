"""Small files replaced whole and durably: checkpoints, manifests, counters.

A reader after a crash (process or machine) finds either the old content or the new, never a torn
file, and once ``replace_durably`` returns, a power loss cannot bring the old content back: the
new file's data is fsynced before the rename and the directory after it. Other processes act on
what such files promise (the WAL manager deletes objects a log start no longer covers), so the
promise must outlive the machine, not just the process.
"""

from __future__ import annotations

import os


def fsync_directory(path: str) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (see the module docstring)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(os.path.dirname(path) or ".")
