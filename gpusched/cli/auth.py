"""``gpusched auth ...`` (keys and tokens of the key method) and ``gpusched authd``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gpusched.cli.common import new_app

if TYPE_CHECKING:
    from gpusched.config import Config

auth_app = new_app("Authentication: the keys of the 'key' method, and credentials.")

ConfigOption = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="Configuration file (default: $GPUSCHED_CONFIG or "
                 "/etc/gpusched/gpusched.toml)."),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace an existing file.")]


def _load(path: Path | None) -> Config:
    from gpusched.config import load_config
    from gpusched.paths import default_config_path

    return load_config(path or default_config_path())


@auth_app.command("keygen")
def keygen(
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Where to write it (default: [auth] key_file).")] = None,
    config: ConfigOption = None,
    force: ForceOption = False,
) -> None:
    """Write a new random master key (mode 0600), for controller hosts only.

    Examples: gpusched auth keygen; gpusched auth keygen -o /etc/gpusched/auth/master.key.new
    """
    from gpusched.auth.keys import new_master_key, render_master_key, write_key_file

    path = output or _load(config).auth.key_file
    key = new_master_key()
    write_key_file(path, render_master_key(key), replace=force)
    typer.echo(f"wrote master key {key.key_id} to {path}")


@auth_app.command("derive")
def derive(
    host: Annotated[str, typer.Option("--host", help="The host (node name for a GPU node).")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="Where to write the host key ('-': standard output).")],
    key_file: Annotated[Optional[Path], typer.Option(
        "--key-file", help="The master key (default: [auth] key_file).")] = None,
    config: ConfigOption = None,
    force: ForceOption = False,
) -> None:
    """Write the key of one host, derived from the master key; copy it to that host as
    its [auth] host_key_file (owner root, mode 0600).

    Examples: gpusched auth derive --host gpu01 -o gpu01.key;
    gpusched auth derive --host login1 -o - | ssh root@login1 'umask 077; cat > /etc/gpusched/auth/host.key'
    """
    from gpusched.auth.keys import (
        derive_host_key,
        read_master_key,
        render_host_key,
        write_key_file,
    )

    master = read_master_key(key_file or _load(config).auth.key_file)
    key = derive_host_key(master, host)
    if str(output) == "-":
        sys.stdout.write(render_host_key(key))
        return
    write_key_file(output, render_host_key(key), replace=force)
    typer.echo(f"wrote the key of host {host} (master key {key.key_id}) to {output}")


@auth_app.command("token")
def token(
    node: Annotated[Optional[str], typer.Option(
        "--node", help="A node credential (the agent's; needs this host's key or root).")] = None,
    config: ConfigOption = None,
) -> None:
    """Print a fresh credential of the caller, as the Authorization header carries it.

    Examples: gpusched auth token; curl -H "Authorization: $(gpusched auth token)" ...
    """
    from gpusched.auth.backends import credential_source
    from gpusched.errors import UsageError

    source = credential_source(_load(config).auth)
    if source is None:
        raise UsageError("[auth] method is 'none': there are no credentials to make")
    typer.echo(source.authorization(node=node))


def authd(
    config: ConfigOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the local signer of the key method (as root): gives each local user a
    credential for their own uid, from this host's key, over a Unix socket.

    Examples: gpusched authd; (as a service) systemctl start gpusched-authd
    """
    import signal

    from gpusched.auth.authd import Authd
    from gpusched.auth.keys import read_host_key
    from gpusched.auth.keytoken import KeySigner
    from gpusched.errors import ConfigError

    cfg = _load(config).auth
    if cfg.method != "key":
        raise ConfigError(f"gpusched authd serves the 'key' method; [auth] method is "
                          f"{cfg.method!r}")
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    daemon = Authd(KeySigner(read_host_key(cfg.host_key_file), cfg.ttl), cfg.authd_socket)
    daemon.bind()

    def reload(*_: object) -> None:
        try:
            daemon.signer = KeySigner(read_host_key(cfg.host_key_file), cfg.ttl)
            logging.getLogger("gpusched.authd").info(
                "reloaded the host key (key id %s)", daemon.signer.key.key_id)
        except ConfigError as exc:
            logging.getLogger("gpusched.authd").error("kept the old host key: %s", exc.message)

    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    signal.signal(signal.SIGHUP, reload)
    if os.geteuid() != 0:
        logging.getLogger("gpusched.authd").warning(
            "not running as root: only this user's processes should use this socket")
    daemon.serve()
