"""The messages that cross a process boundary, typed: each is a frozen dataclass with
``parse(raw)``, which checks every field's type and bounds once, at the edge where the
message arrives, and raises one ``UsageError`` naming the field; and ``to_json()``, which
gives the shape ``parse`` takes back.

- ``JobRequest``, ``JobUpdate``: a user's submission and change of a job (gpusched.db.submit
  adds what needs the database).
- ``LaunchOrder``, ``JobEnd``, ``NodeCommand``, ``NodeHealth``: between the controller and
  a node's agent.

Pure: no database, no I/O (docs/api.md describes the shapes).
"""

from gpusched.messages.agent import (
    COMMAND_KINDS,
    GRES_FLAGS,
    MAX_ERROR_TEXT,
    OUTCOMES,
    JobEnd,
    LaunchOrder,
    LimitJob,
    NodeCommand,
    NodeHealth,
    SignalJob,
    error_text,
    launch_job_of,
)
from gpusched.messages.jobs import SUBMIT_FIELDS, UNLIMITED, JobRequest, JobUpdate

__all__ = [
    "COMMAND_KINDS", "GRES_FLAGS", "MAX_ERROR_TEXT", "OUTCOMES", "SUBMIT_FIELDS", "UNLIMITED", "JobEnd",
    "JobRequest", "JobUpdate", "LaunchOrder", "LimitJob", "NodeCommand", "NodeHealth", "SignalJob",
    "error_text", "launch_job_of",
]
