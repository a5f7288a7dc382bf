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

TYPE_CHECKING = False  # typing's own costs gsrun, which loads only ``stepio``, ~5 ms
if TYPE_CHECKING:
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

# Each name is imported from its module when first asked for: a process that needs one
# small module of this package (gsrun and the step supervisor need only ``stepio``) does
# not pay for the submission's parsers (dependencies, shapes, the priority model).
_JOBS_NAMES = frozenset({"SUBMIT_FIELDS", "UNLIMITED", "JobRequest", "JobUpdate"})


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module = import_module(f"{__name__}.{'jobs' if name in _JOBS_NAMES else 'agent'}")
    value = getattr(module, name)
    globals()[name] = value
    return value
