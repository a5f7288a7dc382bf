"""gsubmit's container options (typer's declarations), as NVIDIA's pyxis plugin adds
them to sbatch (docs/user-guide.md, "Containers"); gpusched.cli.containerrequest makes
the submission's ``container`` object of their values."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer


def _text(name: str, metavar: str, help_text: str) -> Any:
    return typer.Option(name, metavar=metavar, show_default=False, help=help_text)


ContainerImageOpt = Annotated[str | None, _text(
    "--container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
    "Run the batch script in a container of this image (pyxis's option): an image "
    "reference, or a path to an image file on the node.")]
ContainerMountsOpt = Annotated[str | None, _text(
    "--container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
    "Bind mounts into the container; flags joined with '+', such as ro+rprivate.")]
ContainerWorkdirOpt = Annotated[str | None, _text(
    "--container-workdir", "PATH", "Working directory inside the container (default: the "
    "image's).")]
ContainerNameOpt = Annotated[str | None, _text(
    "--container-name", "NAME", "A named container kept on the node between jobs (enroot).")]
ContainerSaveOpt = Annotated[str | None, _text(
    "--container-save", "PATH", "Refused: a container's changes are not saved to an image.")]
ContainerMountHomeOpt = Annotated[Optional[bool], typer.Option(
    "--container-mount-home/--no-container-mount-home",
    help="Bind mount (or not) your home directory (default: not).", show_default=False)]
ContainerRemapRootOpt = Annotated[Optional[bool], typer.Option(
    "--container-remap-root/--no-container-remap-root",
    help="Be root inside the container (no privilege on the node).", show_default=False)]
ContainerEntrypointOpt = Annotated[Optional[bool], typer.Option(
    "--container-entrypoint/--no-container-entrypoint",
    help="Run the image's entrypoint before the script (default: not).", show_default=False)]
ContainerEntrypointLogOpt = Annotated[bool, typer.Option(
    "--container-entrypoint-log", help="Accepted: the entrypoint's output goes to the "
    "job's output in any case.")]
ContainerWritableOpt = Annotated[Optional[bool], typer.Option(
    "--container-writable/--container-readonly",
    help="Make the container's filesystem writable (default: read-only).", show_default=False)]
ContainerEnvOpt = Annotated[str | None, _text(
    "--container-env", "NAME[,NAME...]", "Variables whose value from the job wins over "
    "the image's.")]
