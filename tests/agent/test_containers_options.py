"""gsubmit's container options as pyxis has them, from the command line, directives and
PYXIS_CONTAINER_* variables (gpusched.cli.containerrequest): the submission's
``container`` object, and one error line naming the option and where it came from."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.cli.containerrequest import CONTAINER_OPTIONS, container_request
from gpusched.errors import UsageError
from gpusched.messages.containers import ContainerRequest


def _values(**given: Any) -> dict[str, Any]:
    values: dict[str, Any] = {name: None for name in CONTAINER_OPTIONS}
    values["container_entrypoint_log"] = False
    return {**values, **given}


def test_no_option_no_container() -> None:
    assert container_request(_values(), {}, {}) is None
    # pyxis's variables alone, without an image, do nothing
    assert container_request(_values(), {}, {"PYXIS_CONTAINER_MOUNTS": "/a:/b"}) is None


def test_options_make_a_request_the_controller_takes() -> None:
    body = container_request(_values(
        container_image="ubuntu:22.04", container_mounts="/d:/d:ro+rprivate,tmpfs:/t",
        container_workdir="w", container_env="A,B", container_mount_home=False,
        container_writable=True), {}, {})
    assert body == {"image": "ubuntu:22.04", "mounts": ["/d:/d:ro+rprivate", "tmpfs:/t"],
                    "workdir": "/w", "env": ["A", "B"], "name": None, "mount_home": False,
                    "remap_root": None, "writable": True, "entrypoint": None}
    assert ContainerRequest.parse(body).to_json() == body


def test_pyxis_variables_fill_what_is_not_given() -> None:
    environ = {"PYXIS_CONTAINER_IMAGE": "from-env", "PYXIS_CONTAINER_MOUNTS": "/e:/e",
               "PYXIS_CONTAINER_READONLY": "yes", "PYXIS_CONTAINER_REMAP_ROOT": "1",
               "PYXIS_CONTAINER_MOUNT_HOME": "n", "PYXIS_CONTAINER_UNKNOWN": "x"}
    body = container_request(_values(), {}, environ)
    assert body is not None and body["image"] == "from-env" and body["mounts"] == ["/e:/e"]
    assert (body["writable"], body["remap_root"], body["mount_home"]) == (False, True, False)
    # The command line (or a directive) wins, an explicit --no-... included.
    body = container_request(_values(container_image="mine", container_remap_root=False),
                             {}, environ)
    assert body is not None and body["image"] == "mine" and body["remap_root"] is False


@pytest.mark.parametrize("given, origins, environ, words", [
    ({"container_mounts": "/a:b"}, {}, {"PYXIS_CONTAINER_IMAGE": "u"},
     "--container-mounts: mount target must be"),
    ({"container_image": "u", "container_env": "A=1"}, {"container_env": "line 2: #SBATCH"},
     {}, "line 2: #SBATCH: --container-env: invalid format"),
    ({"container_workdir": "/w"}, {}, {}, "--container-workdir: needs --container-image"),
    ({"container_image": "u", "container_save": "/x.sqsh"}, {}, {},
     "--container-save: not supported"),
    ({"container_image": "u"}, {}, {"PYXIS_CONTAINER_WRITABLE": "maybe"},
     "PYXIS_CONTAINER_WRITABLE: expected 1, true"),
    ({}, {}, {"PYXIS_CONTAINER_IMAGE": "u", "PYXIS_CONTAINER_MOUNTS": "rel:/x"},
     "PYXIS_CONTAINER_MOUNTS: --container-mounts: mount source must be"),
])
def test_faults_name_the_option_and_its_origin(given: dict[str, Any], origins: dict[str, str],
                                               environ: dict[str, str], words: str) -> None:
    with pytest.raises(UsageError) as caught:
        container_request(_values(**given), origins, environ)
    assert words in caught.value.message and "\n" not in caught.value.message
