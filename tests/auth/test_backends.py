"""From [auth] settings to a working verifier (controller) and credential source
(client, agent), for each method, with real key files and a real munged."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpusched.auth.backends import authenticator_for, credential_source, verifier_for
from gpusched.auth.keys import (
    derive_host_key,
    new_master_key,
    render_host_key,
    render_master_key,
    write_key_file,
)
from gpusched.auth.keytoken import KeySigner
from gpusched.auth.munge import MungeSigner
from gpusched.auth.settings import AuthConfig
from gpusched.errors import AuthError, ConfigError
from tests.auth.munged import Munged


@pytest.fixture
def key_config(tmp_path: Path) -> AuthConfig:
    master = new_master_key()
    write_key_file(tmp_path / "master.key", render_master_key(master))
    write_key_file(tmp_path / "host.key", render_host_key(derive_host_key(master, "gpu07")))
    return AuthConfig(method="key", key_file=tmp_path / "master.key",
                      host_key_file=tmp_path / "host.key",
                      authd_socket=tmp_path / "run" / "authd.sock")


def test_method_none_has_no_authenticator_and_no_credentials() -> None:
    assert authenticator_for(AuthConfig()) is None
    assert credential_source(AuthConfig()) is None
    with pytest.raises(ValueError):
        verifier_for(AuthConfig())


def test_key_method_round_trip_for_the_agent_and_root(key_config: AuthConfig) -> None:
    source = credential_source(key_config)
    assert isinstance(source, KeySigner)  # root reads the host key and signs itself
    authenticator = authenticator_for(key_config)
    assert authenticator is not None
    node = authenticator.authenticate(source.authorization(node="gpu07"))
    assert (node.uid, node.node, node.host) == (0, "gpu07", "gpu07")
    user = authenticator.authenticate(source.authorization())
    assert (user.uid, user.node) == (0, None)


def test_key_method_refuses_munge_credentials(key_config: AuthConfig, tmp_path: Path) -> None:
    authenticator = authenticator_for(key_config)
    assert authenticator is not None
    with pytest.raises(AuthError, match="takes GPUSCHED-KEY credentials, not GPUSCHED-MUNGE"):
        authenticator.authenticate("GPUSCHED-MUNGE MUNGE:AAAA:", time.time())


def test_key_method_with_a_previous_key_accepts_both(key_config: AuthConfig,
                                                     tmp_path: Path) -> None:
    old = new_master_key()
    write_key_file(tmp_path / "old.key", render_master_key(old))
    authenticator = authenticator_for(replace(key_config, previous_key_file=tmp_path / "old.key"))
    assert authenticator is not None
    old_signer = KeySigner(derive_host_key(old, "gpu07"))
    assert authenticator.authenticate(old_signer.authorization(node="gpu07")).node == "gpu07"
    only_new = authenticator_for(key_config)
    assert only_new is not None
    with pytest.raises(AuthError, match="unknown key"):
        only_new.authenticate(old_signer.authorization(node="gpu07"))


def test_key_method_without_its_master_key_does_not_start(key_config: AuthConfig,
                                                          tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such key file"):
        verifier_for(replace(key_config, key_file=tmp_path / "absent.key"))


def test_key_method_without_a_readable_host_key_asks_authd(key_config: AuthConfig,
                                                           tmp_path: Path) -> None:
    source = credential_source(replace(key_config, host_key_file=tmp_path / "absent.key"))
    assert type(source).__name__ == "AuthdClient"


def test_munge_method_round_trip_with_node_addresses(tmp_path: Path) -> None:
    daemon = Munged()
    try:
        cfg = AuthConfig(method="munge", munge_socket=daemon.socket)
        source = credential_source(cfg)
        assert isinstance(source, MungeSigner)
        authenticator = authenticator_for(
            cfg, node_addresses=lambda n: ["127.0.0.1"] if n == "gpu07" else [])
        assert authenticator is not None
        assert authenticator.authenticate(source.authorization(node="gpu07")).node == "gpu07"
        with pytest.raises(AuthError, match="does not speak from"):
            authenticator.authenticate(source.authorization(node="gpu08"))
        header = source.authorization()
        assert authenticator.authenticate(header).uid == 0
        with pytest.raises(AuthError, match="replayed"):
            authenticator.authenticate(header)
    finally:
        daemon.stop()
