"""scontrol's node updates for gcontrol: ``update node NODES State=DRAIN Reason=TEXT``
(scontrol's ``update NodeName=NODES ...`` too) drains nodes, ``State=RESUME`` (``IDLE``,
``UNDRAIN``) returns them to service; what else scontrol sets on a node is refused
naming it."""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.errors import UsageError

DRAIN = ("drain",)
RESUME = ("resume", "idle", "undrain")
_REFUSED_STATES = {
    "down": "a node is taken out of service with State=DRAIN here (its running jobs go on); "
            "DOWN is what the controller marks a node it lost",
    "fail": "use State=DRAIN (a node here is drained, or in service)",
    "future": "nodes are not defined ahead of time here",
    "power_down": "nodes are not powered by gpusched", "power_up": "nodes are not powered by gpusched",
    "reboot": "nodes are not rebooted by gpusched",
}


def node_update_argv(args: list[str]) -> list[str]:
    """scontrol's ``update NodeName=NODES KEY=VALUE...`` as ``update node NODES ...``."""
    if len(args) >= 2 and args[0] == "update":
        key, sep, value = args[1].partition("=")
        if sep and key.lower() in ("nodename", "node"):
            return ["update", "node", value, *args[2:]]
    return args


def node_changes(nodes: str, settings: Sequence[str]) -> list[tuple[str, dict[str, str] | None]]:
    """The requests an update of ``nodes`` (a host list) makes: (path, body) each."""
    from gpusched.core.hostlist import HostlistError, expand_hostlist

    state = reason = None
    for setting in settings:
        key, sep, value = setting.partition("=")
        name = key.strip().lower()
        if not sep or not value.strip():
            raise UsageError(f"invalid setting {setting[:60]!r}: expected State=DRAIN|RESUME "
                             "and Reason=TEXT")
        if name == "state":
            state = value.strip().lower()
        elif name == "reason":
            reason = value.strip()
        else:
            raise UsageError(f"{key.strip()[:40]}: not supported: a node's State and Reason "
                             "are all gcontrol changes (its GPUs and features come from its "
                             "agent and the admin configuration)")
    if state is None:
        raise UsageError("update node: give State=DRAIN (with Reason=TEXT) or State=RESUME")
    if state in _REFUSED_STATES:
        raise UsageError(f"State={state.upper()}: not supported: {_REFUSED_STATES[state]}")
    if state not in DRAIN + RESUME:
        raise UsageError(f"invalid State={state.upper()[:24]}: expected DRAIN or RESUME "
                         "(IDLE, UNDRAIN)")
    if state in DRAIN and not reason:
        raise UsageError("State=DRAIN needs Reason=TEXT (why it is out of service)")
    try:
        names = expand_hostlist(nodes)
    except HostlistError as err:
        raise UsageError(f"invalid node list {nodes[:64]!r}: {err}") from None
    if state in DRAIN:
        return [(f"/v1/nodes/{name}/drain", {"reason": str(reason)}) for name in names]
    return [(f"/v1/nodes/{name}/resume", None) for name in names]
