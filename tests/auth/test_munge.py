"""The munge back-end against a real munged with its own key: uid/gid of root and of a
real unprivileged user, replay, expiry, another key, node credentials and garbage.
Every test runs through libmunge (ctypes) and through the munge/unmunge programs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusched.auth.credential import SCHEME_MUNGE, parse_authorization
from gpusched.auth.munge import MungeSigner, MungeVerifier
from gpusched.auth.mungeclient import LibMunge, MungeClient, munge_client
from gpusched.errors import AuthError, Unavailable
from tests.auth.munged import Munged
from tests.security.conftest import LocalUser, run_as

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["library", "programs"])
def client(request: pytest.FixtureRequest, munged: Munged) -> MungeClient:
    made = munge_client(munged.socket, request.param)
    assert made.kind == request.param
    return made


def user_credential(user: LocalUser, munged: Munged, payload: str = "gpusched 1 user",
                    ttl: int = 60) -> str:
    """A credential made by ``user``'s own process through the munge program."""
    done = run_as(user, ["munge", "-S", str(munged.socket), "-s", payload, "-t", str(ttl)])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_root_credential_round_trips(client: MungeClient) -> None:
    header = MungeSigner(client).authorization()
    scheme, token = parse_authorization(header)
    assert scheme == SCHEME_MUNGE
    identity = MungeVerifier(client).verify(token, time.time())
    assert (identity.uid, identity.gid, identity.node, identity.method) == (0, 0, None, "munge")
    assert identity.host == "127.0.0.1"


def test_unprivileged_user_gets_their_own_uid_and_gid(
        client: MungeClient, munged: Munged, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    identity = MungeVerifier(client).verify(user_credential(mallory, munged), time.time())
    assert (identity.uid, identity.gid) == (mallory.uid, mallory.gid)
    assert identity.node is None


def test_the_library_signs_as_the_unprivileged_user_that_calls_it(
        munged: Munged, attackers: tuple[LocalUser, LocalUser]) -> None:
    _, alice = attackers
    code = ("from pathlib import Path; from gpusched.auth.munge import MungeSigner; "
            "from gpusched.auth.mungeclient import LibMunge; "
            f"print(MungeSigner(LibMunge(Path({str(munged.socket)!r}))).sign())")
    done = run_as(alice, [sys.executable, "-c", code], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    identity = MungeVerifier(LibMunge(munged.socket)).verify(done.stdout.strip(), time.time())
    assert (identity.uid, identity.gid) == (alice.uid, alice.gid)


def test_a_replayed_credential_is_refused(client: MungeClient) -> None:
    token = MungeSigner(client).sign()
    check = MungeVerifier(client)
    assert check.verify(token, time.time()).uid == 0
    with pytest.raises(AuthError, match="replayed"):
        check.verify(token, time.time())


def test_a_replayed_credential_is_refused_across_library_and_programs(munged: Munged) -> None:
    token = MungeSigner(LibMunge(munged.socket)).sign()
    MungeVerifier(munge_client(munged.socket, "programs")).verify(token, time.time())
    with pytest.raises(AuthError, match="replayed"):
        MungeVerifier(LibMunge(munged.socket)).verify(token, time.time())


def test_an_expired_credential_is_refused(client: MungeClient) -> None:
    token = MungeSigner(client, ttl=1).sign()
    made = time.time()
    # munged expires a credential once its whole ttl second has passed: wait that out.
    while time.time() < made + 2.5:
        time.sleep(0.1)
    with pytest.raises(AuthError, match="expired"):
        MungeVerifier(client).verify(token, time.time())


def test_a_ttl_longer_than_the_controller_accepts_is_refused(
        client: MungeClient, munged: Munged, attackers: tuple[LocalUser, LocalUser]) -> None:
    token = user_credential(attackers[0], munged, ttl=3600)
    with pytest.raises(AuthError, match="time-to-live of 3600"):
        MungeVerifier(client, ttl=60).verify(token, time.time())


def test_a_credential_of_another_munge_key_is_refused(client: MungeClient) -> None:
    other = Munged()
    try:
        token = MungeSigner(munge_client(other.socket)).sign()
    finally:
        other.stop()
    with pytest.raises(AuthError, match="munge"):
        MungeVerifier(client).verify(token, time.time())


def test_a_credential_made_for_another_service_is_refused(
        client: MungeClient, munged: Munged, attackers: tuple[LocalUser, LocalUser]) -> None:
    token = user_credential(attackers[0], munged, payload="slurm job 17")
    with pytest.raises(AuthError, match="not made for gpusched"):
        MungeVerifier(client).verify(token, time.time())


@pytest.mark.parametrize("token", [
    "MUNGE:garbage:", "MUNGE:AAAA:", "hello", "MUNGE:" + "A" * 5000 + ":", "MUNGE:\u00e9:",
    "MUNGE:AwQFAACVXppCUUMJOoUgKwh/yjQhKbQyfRszqb8aBL5rJe3iSXleDkcTXcJM3UX72N9R5bmfoNAo:",
    "", "MUNGE::", "MUNGE:AA AA:",
])
def test_garbage_and_oversized_credentials_are_refused(client: MungeClient, token: str) -> None:
    with pytest.raises(AuthError):
        MungeVerifier(client).verify(token, time.time())


def test_node_credential_of_root_from_an_allowed_address(client: MungeClient) -> None:
    token = MungeSigner(client).sign(node="gpu01")
    identity = MungeVerifier(client, node_addresses=lambda n: {"127.0.0.1"} if n == "gpu01"
                        else set()).verify(token, time.time())
    assert (identity.uid, identity.node) == (0, "gpu01")


def test_node_credential_from_an_address_the_node_does_not_have_is_refused(
        client: MungeClient) -> None:
    token = MungeSigner(client).sign(node="gpu01")
    check = MungeVerifier(client, node_addresses=lambda n: {"10.0.0.1"} if n == "gpu01" else set())
    with pytest.raises(AuthError, match="does not speak from 127.0.0.1"):
        check.verify(token, time.time())


def test_node_credential_of_another_host_with_the_same_munge_key_is_refused(
        client: MungeClient, munged: Munged) -> None:
    """Another host (same munge key, another origin address) cannot speak for gpu01."""
    elsewhere = Munged(key=munged.key, origin="10.9.8.7")
    try:
        token = MungeSigner(munge_client(elsewhere.socket)).sign(node="gpu01")
    finally:
        elsewhere.stop()
    check = MungeVerifier(client, node_addresses=lambda n: {"127.0.0.1"})
    with pytest.raises(AuthError, match="does not speak from 10.9.8.7"):
        check.verify(token, time.time())


def test_node_credential_of_an_unprivileged_user_is_refused(
        client: MungeClient, munged: Munged, attackers: tuple[LocalUser, LocalUser]) -> None:
    token = user_credential(attackers[0], munged, payload="gpusched 1 node gpu01")
    check = MungeVerifier(client, node_addresses=lambda n: {"127.0.0.1"})
    with pytest.raises(AuthError, match=f"uid {attackers[0].uid} cannot speak for node gpu01"):
        check.verify(token, time.time())


def test_node_credential_without_known_addresses_is_refused(client: MungeClient) -> None:
    token = MungeSigner(client).sign(node="gpu01")
    with pytest.raises(AuthError, match="knows no address"):
        MungeVerifier(client).verify(token, time.time())


def test_munged_unreachable_is_unavailable_not_a_bad_credential(
        client: MungeClient, munged: Munged, tmp_path: Path) -> None:
    token = MungeSigner(client).sign()
    away = munge_client(tmp_path / "no-such.socket", client.kind)
    with pytest.raises(Unavailable):
        MungeVerifier(away).verify(token, time.time())
    with pytest.raises(Unavailable):
        MungeSigner(away).sign()


def test_programs_are_used_when_libmunge_cannot_be_loaded(munged: Munged) -> None:
    code = ("import ctypes.util; ctypes.util.find_library = lambda name: None\n"
            "import ctypes\n_real = ctypes.CDLL\n"
            "class Refuse(_real):\n"
            "    def __init__(self, name, *a, **k):\n"
            "        if 'munge' in str(name): raise OSError('no libmunge here')\n"
            "        super().__init__(name, *a, **k)\n"
            "ctypes.CDLL = Refuse\n"
            "from pathlib import Path\nfrom gpusched.auth.mungeclient import munge_client\n"
            f"c = munge_client(Path({str(munged.socket)!r}))\nprint(c.kind)\n"
            "print(c.encode(b'gpusched 1 user', 60))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    kind, token = done.stdout.split()
    assert kind == "programs"
    assert MungeVerifier(LibMunge(munged.socket)).verify(token, time.time()).uid == 0
