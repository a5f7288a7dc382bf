"""Per-job cgroups: device allow-lists, memory and CPU limits, whole-job kill, usage.

Both cgroup v2 (one unified hierarchy; devices through an eBPF program) and v1 (one
hierarchy per controller) are handled. Stdlib and ctypes only: the per-job supervisor
imports this package.
"""

from gpusched.agent.cgroups.devices import (
    DeviceRule,
    gpu_device_rules,
    parse_proc_devices,
)
from gpusched.agent.cgroups.job import JobCgroup, Usage
from gpusched.agent.cgroups.tree import (
    CgroupTree,
    CgroupUnavailable,
    CgroupUnsupported,
    detect,
)

__all__ = [
    "CgroupTree",
    "CgroupUnavailable",
    "CgroupUnsupported",
    "DeviceRule",
    "JobCgroup",
    "Usage",
    "detect",
    "gpu_device_rules",
    "parse_proc_devices",
]
