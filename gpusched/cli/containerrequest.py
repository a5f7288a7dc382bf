"""The submission's ``container`` object, made of gsubmit's pyxis options (declared in
gpusched.cli.containeropts). Loaded on gsubmit's common path, so nothing heavy at import:
the checks (gpusched.messages.containers) are loaded only when an option is given."""

from __future__ import annotations

# No typing at run time (see gpusched.cli.console): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The options (their parameter names), in the order gsubmit declares them.
CONTAINER_OPTIONS = ("container_image", "container_mounts", "container_workdir",
                     "container_name", "container_save", "container_mount_home",
                     "container_remap_root", "container_entrypoint",
                     "container_entrypoint_log", "container_writable", "container_env")


def container_request(values: dict[str, Any], origins: dict[str, str]) -> dict[str, Any] | None:
    """The submission's ``container`` object from the merged option values (None: no
    --container-image); each option given is checked, a fault is one UsageError naming
    the option (and the directive line it came from)."""
    given = [name for name in CONTAINER_OPTIONS if values.get(name) not in (None, False)]
    if not given:
        return None
    from gpusched.errors import UsageError
    from gpusched.messages import containers as checks

    def where(name: str) -> str:
        return f"{origins[name]}: " if name in origins else ""

    def checked(name: str, check: Any) -> Any:
        try:
            return check(values[name])
        except UsageError as err:
            raise UsageError(where(name) + err.message) from None

    if values["container_save"] is not None:
        raise UsageError(where("container_save") + checks.NOT_SUPPORTED["container_save"])
    if values["container_image"] is None:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(f"{where(given[0])}{flag}: needs --container-image (the image to "
                         "run the job in)")
    mounts = checked("container_mounts", checks.parse_mounts) if values["container_mounts"] \
        else ()
    return {
        "image": checked("container_image", checks.check_image),
        "mounts": [m.text for m in mounts],
        "workdir": None if values["container_workdir"] is None
        else checked("container_workdir", checks.check_workdir),
        "env": list(checked("container_env", checks.parse_env_names))
        if values["container_env"] is not None else [],
        "name": None if values["container_name"] is None
        else checked("container_name", checks.check_container_name),
        "mount_home": values["container_mount_home"],
        "remap_root": values["container_remap_root"],
        "writable": values["container_writable"],
        "entrypoint": values["container_entrypoint"],
    }
