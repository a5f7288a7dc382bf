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


# pyxis's input variables: each sets its option where neither the command line nor a
# directive does (a switch's value: 1, true, yes, y or 0, false, no, n).
PYXIS_VARIABLES = {"PYXIS_CONTAINER_" + name[len("container_"):].upper(): name
                   for name in CONTAINER_OPTIONS}
PYXIS_VARIABLES["PYXIS_CONTAINER_READONLY"] = "container_readonly"
_SWITCHES = ("container_mount_home", "container_remap_root", "container_entrypoint",
             "container_entrypoint_log", "container_writable", "container_readonly")


def container_request(values: dict[str, Any], origins: dict[str, str],
                      environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The submission's ``container`` object from the merged option values and pyxis's
    PYXIS_CONTAINER_* variables of ``environ`` (default: gsubmit's environment); None:
    no --container-image. Each option given is checked, a fault is one UsageError naming
    the option (and the directive line or variable it came from)."""
    explicit = _given(values)
    values, origins = _with_variables(values, origins, environ)
    given = _given(values)
    if not explicit and values.get("container_image") is None:
        return None  # pyxis's variables alone, without an image, do nothing (as in pyxis)
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
        flag = _spelling(given[0], values[given[0]])
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


def _given(values: dict[str, Any]) -> list[str]:
    """The container options set (a switch's off form too: it is as meaningless without
    an image as its on form)."""
    return [name for name in CONTAINER_OPTIONS if values.get(name) is not None
            and not (name == "container_entrypoint_log" and values[name] is False)]


def _spelling(name: str, value: Any) -> str:
    """The option as it was written: a switch's off form for False."""
    if value is False:
        return "--container-readonly" if name == "container_writable" \
            else "--no-" + name.replace("_", "-")
    return "--" + name.replace("_", "-")


def _with_variables(values: dict[str, Any], origins: dict[str, str],
                    environ: dict[str, str] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """``values`` with the options the PYXIS_CONTAINER_* variables set, and where each
    came from."""
    if environ is None:
        import os

        environ = dict(os.environ)
    found = {var: text for var, text in environ.items() if var.startswith("PYXIS_CONTAINER_")}
    if not found:
        return values, origins
    from gpusched.errors import UsageError

    values, origins = dict(values), dict(origins)
    for var, text in sorted(found.items()):
        name = PYXIS_VARIABLES.get(var)
        if name is None:
            continue  # not one of pyxis's: pyxis ignores it too
        option = "container_writable" if name == "container_readonly" else name
        # Set by the command line or a directive (a plain flag's False is its default).
        current = values.get(option)
        if current if option == "container_entrypoint_log" else current is not None:
            continue
        if name in _SWITCHES:
            on = {"1": True, "true": True, "yes": True, "y": True, "0": False,
                  "false": False, "no": False, "n": False}.get(text)
            if on is None:
                raise UsageError(f"{var}: expected 1, true, yes, y, 0, false, no or n, got "
                                 f"{text[:40]!r}")
            values[option] = (not on) if name == "container_readonly" else on
        else:
            values[option] = text
        origins[option] = var
    return values, origins
