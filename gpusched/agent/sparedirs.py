"""Job directories kept for later runs, so that a run makes almost no new file.

On a file system that is slow to make files (ext4 without a journal looks past every
inode freed in the last minutes before it hands one out), the files a run makes and
removes cost the node more than anything else the agent does for it. So the directory
of a run whose end the controller has recorded is not removed but kept, as
``jobs_dir/.spare-N``, and the next launch renames it to its own job's name. What it
keeps, each emptied, is what holds no trace of the last run's user:

- ``status.reserve``, the room set aside for the run's end (jobfiles.make_reserve keeps
  one that is set aside already);
- ``supervisor.lock`` and ``supervisor.log`` (both the agent's, never the job's);
- ``spec.json``, ``supervisor.json`` and ``status.json``, each renamed to its ``.tmp``:
  the file the next run's atomic write of it opens and truncates.

Everything else goes, the script first: the job's user owns it, and a process of the
last run (unconfined, say) may still read it. A directory that lacks the lock or the
reserve (given up on a full disk), or holds a directory, is removed as before. Spares
left by an agent that stopped are removed when the next one starts
(jobends.remove_discarded). Standard library only.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
from collections import deque
from pathlib import Path

from gpusched.agent.jobfiles import RESERVE

SPARE = ".spare-"
MAX_SPARES = 32  # directories kept at most (each about 70 KB, most of it the reserve)
LOCK, LOG = "supervisor.lock", "supervisor.log"
KEPT = frozenset({RESERVE, LOCK, LOG})
# Written atomically by each run (write_json_atomic): kept as the temporary file.
RENAMED = ("spec.json", "supervisor.json", "status.json")
_TEMPORARY = frozenset(f"{name}.tmp" for name in RENAMED)


class SpareDirs:
    """The spare job directories of one agent's ``jobs_dir``."""

    def __init__(self, jobs_dir: Path, limit: int = MAX_SPARES) -> None:
        self.jobs_dir = jobs_dir
        self.limit = limit
        self._spares: deque[str] = deque()
        self._names = itertools.count()

    def __len__(self) -> int:
        return len(self._spares)

    def keep(self, jobdir: Path) -> bool:
        """Keep the directory of a run whose supervisor has exited and whose end is
        recorded as a spare; False (and the directory left as it was, or gone) when it
        cannot be: the caller removes it then."""
        if len(self._spares) >= self.limit:
            return False
        spare = os.path.join(self.jobs_dir, f"{SPARE}{next(self._names)}")
        try:
            os.rename(jobdir, spare)  # first: nothing of it stays under the job's id
        except OSError:
            return False
        try:
            self._empty(spare)
        except OSError:
            shutil.rmtree(spare, ignore_errors=True)
            return True  # gone: nothing left for the caller to remove
        self._spares.append(spare)
        return True

    def take(self, jobdir: Path) -> bool:
        """Make a spare the new directory ``jobdir``; False (nothing done) when there is
        none, or ``jobdir`` exists already: the caller makes it then."""
        if not self._spares or os.path.lexists(jobdir):
            return False
        spare = self._spares.pop()
        try:
            os.rename(spare, jobdir)
        except OSError:
            shutil.rmtree(spare, ignore_errors=True)
            return False
        return True

    @staticmethod
    def _empty(spare: str) -> None:
        """Leave in ``spare`` only the emptied files a run may reuse; OSError when it
        cannot be a spare."""
        with os.scandir(spare) as entries:
            found = {entry.name: entry.is_dir(follow_symlinks=False) for entry in entries}
        if any(found.values()) or not KEPT <= found.keys():
            raise OSError(f"{spare}: not a spare")
        for name in found.keys() - KEPT - _TEMPORARY - set(RENAMED):
            os.unlink(os.path.join(spare, name))
        for name in RENAMED:
            if name in found:
                os.rename(os.path.join(spare, name), os.path.join(spare, f"{name}.tmp"))
        fd = os.open(os.path.join(spare, LOCK), os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no supervisor holds it
            os.ftruncate(fd, 0)  # empty: nothing of the next run has been forked
        finally:
            os.close(fd)
        os.truncate(os.path.join(spare, LOG), 0)
