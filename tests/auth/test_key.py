"""The key back-end's tokens: what is accepted, and every way a token is refused."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.auth.backends import Authenticator
from gpusched.auth.credential import MAX_TOKEN, SCHEME_KEY, parse_authorization
from gpusched.auth.keys import HostKey, derive_host_key, new_master_key
from gpusched.auth.keytoken import KeySigner, KeyVerifier, _mac, decode_token
from gpusched.auth.replay import ReplayCache
from gpusched.errors import AuthError, LimitReached

MASTER = new_master_key()
NODE_A = derive_host_key(MASTER, "gpu-a")
NODE_B = derive_host_key(MASTER, "gpu-b")
LOGIN = derive_host_key(MASTER, "login1.example.org")
NOW = 1_800_000_000.0


def fields(token: str) -> list[str]:
    return token.split(":")


def resign(parts: list[str], key: HostKey) -> str:
    """A token with these fields, correctly signed with ``key`` (what a key holder can do)."""
    signed = ":".join(parts[:9])
    return f"{signed}:{_mac(key.secret, signed)}"


def test_a_user_token_round_trips() -> None:
    header = KeySigner(LOGIN).authorization()
    scheme, token = parse_authorization(header)
    assert scheme == SCHEME_KEY
    identity = KeyVerifier(MASTER).verify(token, time.time())
    assert identity.host == "login1.example.org"
    assert identity.node is None and identity.method == "key"


def test_uid_and_gid_are_the_signed_ones() -> None:
    token = KeySigner(LOGIN).sign(1234, 5678, now=NOW)
    identity = KeyVerifier(MASTER).verify(token, NOW)
    assert (identity.uid, identity.gid, identity.host) == (1234, 5678, "login1.example.org")


def test_a_node_token_proves_its_own_node() -> None:
    token = KeySigner(NODE_A).sign(0, 0, node="gpu-a", now=NOW)
    identity = KeyVerifier(MASTER).verify(token, NOW)
    assert (identity.node, identity.host, identity.uid) == ("gpu-a", "gpu-a", 0)


def test_a_host_key_cannot_sign_for_another_node() -> None:
    with pytest.raises(ValueError, match="cannot sign for node 'gpu-b'"):
        KeySigner(NODE_A).sign(0, 0, node="gpu-b")


def test_node_a_credential_presented_for_node_b_is_refused() -> None:
    token = KeySigner(NODE_A).sign(0, 0, node="gpu-a", now=NOW)
    parts = fields(token)
    parts[3] = "gpu-b"  # claims node B, signed by A's key
    with pytest.raises(AuthError, match="host gpu-a cannot speak for node gpu-b"):
        KeyVerifier(MASTER).verify(resign(parts, NODE_A), NOW)
    parts[2] = "gpu-b"  # claims to come from host B as well: A's key does not match B's
    with pytest.raises(AuthError, match="bad signature"):
        KeyVerifier(MASTER).verify(resign(parts, NODE_A), NOW)


def test_a_forged_signature_is_refused() -> None:
    token = KeySigner(LOGIN).sign(1000, 1000, now=NOW)
    last = "A" if token[-1] != "A" else "B"
    with pytest.raises(AuthError, match="bad signature"):
        KeyVerifier(MASTER).verify(token[:-1] + last, NOW)


@pytest.mark.parametrize("index, value", [(4, "0"), (5, "0"), (2, "gpu-a"), (7, "1800009999"),
                                          (8, "0" * 32)])
def test_an_altered_field_is_refused(index: int, value: str) -> None:
    parts = fields(KeySigner(LOGIN).sign(1000, 1000, now=NOW))
    parts[index] = value
    with pytest.raises(AuthError, match="bad signature|lifetime"):
        KeyVerifier(MASTER).verify(":".join(parts), NOW)


def test_a_host_key_relabelled_as_another_host_is_refused() -> None:
    """Root on gpu-a edits its key file to say host = gpu-b: the key is still A's."""
    relabelled = HostKey("gpu-b", NODE_A.key_id, NODE_A.secret)
    with pytest.raises(AuthError, match="bad signature"):
        KeyVerifier(MASTER).verify(KeySigner(relabelled).sign(0, 0, node="gpu-b", now=NOW), NOW)


def test_a_key_of_another_master_is_refused() -> None:
    stranger = derive_host_key(new_master_key(), "login1.example.org")
    with pytest.raises(AuthError, match="unknown key"):
        KeyVerifier(MASTER).verify(KeySigner(stranger).sign(1000, 1000, now=NOW), NOW)


def test_a_key_of_another_master_under_this_key_id_is_refused() -> None:
    stranger = derive_host_key(new_master_key(), "login1.example.org")
    forged = HostKey(stranger.host, MASTER.key_id, stranger.secret)
    with pytest.raises(AuthError, match="bad signature"):
        KeyVerifier(MASTER).verify(KeySigner(forged).sign(1000, 1000, now=NOW), NOW)


def test_expiry_with_clock_skew_tolerance() -> None:
    token = KeySigner(LOGIN, ttl=60).sign(1000, 1000, now=NOW)
    verifier = KeyVerifier(MASTER, ttl=60, skew=30)
    with pytest.raises(AuthError, match="expired 31 s ago"):
        verifier.verify(token, NOW + 60 + 31)
    assert verifier.verify(token, NOW + 60 + 29).uid == 1000


def test_a_token_from_the_future_beyond_the_skew_is_refused() -> None:
    verifier = KeyVerifier(MASTER, ttl=60, skew=30)
    with pytest.raises(AuthError, match="in the future"):
        verifier.verify(KeySigner(LOGIN).sign(1000, 1000, now=NOW + 31), NOW)
    assert verifier.verify(KeySigner(LOGIN).sign(1000, 1000, now=NOW + 29), NOW).uid == 1000


def test_a_lifetime_longer_than_the_controller_accepts_is_refused() -> None:
    token = KeySigner(LOGIN, ttl=3600).sign(1000, 1000, now=NOW)
    with pytest.raises(AuthError, match="lifetime of 3600 s"):
        KeyVerifier(MASTER, ttl=60).verify(token, NOW)


def test_a_replayed_token_is_refused() -> None:
    verifier = KeyVerifier(MASTER)
    token = KeySigner(LOGIN).sign(1000, 1000, now=NOW)
    verifier.verify(token, NOW)
    with pytest.raises(AuthError, match="replayed"):
        verifier.verify(token, NOW + 1)


def test_rotation_accepts_the_previous_key_only_while_it_is_configured() -> None:
    old, new = MASTER, new_master_key()
    old_host, new_host = derive_host_key(old, "gpu-a"), derive_host_key(new, "gpu-a")
    during = KeyVerifier(new, previous=old)
    assert during.verify(KeySigner(old_host).sign(0, 0, node="gpu-a", now=NOW), NOW).node == "gpu-a"
    assert during.verify(KeySigner(new_host).sign(0, 0, node="gpu-a", now=NOW), NOW).node == "gpu-a"
    after = KeyVerifier(new)
    with pytest.raises(AuthError, match=f"unknown key \\(key id {old.key_id}\\)"):
        after.verify(KeySigner(old_host).sign(0, 0, node="gpu-a", now=NOW), NOW)
    assert after.verify(KeySigner(new_host).sign(0, 0, node="gpu-a", now=NOW), NOW).uid == 0


@pytest.mark.parametrize("token", [
    "", "x", "1:" * 2000, "A" * (MAX_TOKEN + 1), "\u00e9" * 10, "1:abc",
    "2:" + "0" * 16 + ":h::1:1:1:2:" + "0" * 32 + ":" + "A" * 43,
    "1:" + "0" * 16 + ":h::01:1:1:2:" + "0" * 32 + ":" + "A" * 43,
    "1:" + "0" * 16 + ":h::99999999999:1:1:2:" + "0" * 32 + ":" + "A" * 43,
    "1:" + "0" * 16 + ":h::4294967295:1:1:2:" + "0" * 32 + ":" + "A" * 43,
    "1:" + "0" * 16 + ":-h::1:1:1:2:" + "0" * 32 + ":" + "A" * 43,
    "1:" + "0" * 16 + ":h::1:1:1:2:" + "0" * 32 + ":" + "A" * 43 + "\n",
])
def test_garbage_and_oversized_tokens_are_refused(token: str) -> None:
    with pytest.raises(AuthError):
        KeyVerifier(MASTER).verify(token, NOW)


@pytest.mark.parametrize("header", [
    None, "", "Basic dXNlcjpwYXNz", "GPUSCHED-KEY", "GPUSCHED-KEY ", "GPUSCHED-KEY a b",
    "GPUSCHED-KEY " + "A" * (MAX_TOKEN + 1), b"GPUSCHED-KEY \xff", "GPUSCHED-MUNGE MUNGE:AAAA:",
])
def test_bad_headers_are_refused(header: str | bytes | None) -> None:
    with pytest.raises(AuthError):
        Authenticator(KeyVerifier(MASTER)).authenticate(header, NOW)


def test_the_scheme_is_matched_without_regard_to_case() -> None:
    token = KeySigner(LOGIN).sign(7, 7, now=NOW)
    identity = Authenticator(KeyVerifier(MASTER)).authenticate(f"gpusched-key {token}", NOW)
    assert identity.uid == 7


SIGNED = [KeySigner(LOGIN).sign(uid, uid, now=NOW) for uid in range(5)]


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.binary(max_size=MAX_TOKEN + 100),
    st.text(max_size=300),
    st.builds(lambda i, c, t: t[:i % len(t)] + c + t[i % len(t) + 1:],
              st.integers(min_value=0), st.characters(), st.sampled_from(SIGNED)),
    st.sampled_from(SIGNED),
))
def test_any_input_verifies_only_if_signed_else_raises_auth_error(data: bytes | str) -> None:
    authenticator = Authenticator(KeyVerifier(MASTER))
    header = (b"GPUSCHED-KEY " + data) if isinstance(data, bytes) else f"GPUSCHED-KEY {data}"
    try:
        identity = authenticator.authenticate(header, NOW)
    except AuthError:
        return
    assert data in SIGNED, data
    assert identity.uid == SIGNED.index(str(data))


def test_decode_gives_the_signed_fields() -> None:
    token = KeySigner(NODE_B).sign(0, 0, node="gpu-b", now=NOW)
    credential, mac = decode_token(token)
    assert (credential.host, credential.node, credential.issued_at, credential.expires_at,
            credential.key_id) == ("gpu-b", "gpu-b", int(NOW), int(NOW) + 60, MASTER.key_id)
    assert len(credential.nonce) == 32 and token.endswith(mac)


def test_the_replay_cache_stays_bounded_under_a_flood_of_fresh_tokens() -> None:
    cache = ReplayCache(capacity=1000, per_owner=1000)
    verifier = KeyVerifier(MASTER, ttl=60, skew=30, replay=cache)
    signer = KeySigner(LOGIN, ttl=60)
    accepted = refused = 0
    for i in range(3000):
        try:
            verifier.verify(signer.sign(1000 + i % 50, 1000, now=NOW), NOW)
            accepted += 1
        except LimitReached:
            refused += 1
        assert len(cache) <= 1000
    assert (accepted, refused) == (1000, 2000)
    # Once the first credentials cannot be used any more, their room is free again.
    later = NOW + 60 + 30 + 1
    for _ in range(500):
        verifier.verify(signer.sign(1000, 1000, now=later), later)
    assert len(cache) == 500


def test_the_replay_cache_over_time_holds_only_unexpired_nonces() -> None:
    cache = ReplayCache(capacity=100_000)
    verifier = KeyVerifier(MASTER, ttl=10, skew=2, replay=cache)
    signer = KeySigner(LOGIN, ttl=10)
    for second in range(200):
        now = NOW + second
        for i in range(20):
            verifier.verify(signer.sign(i, i, now=now), now)
        # kept until expiry + skew: at most 13 seconds' worth of 20 a second
        assert len(cache) <= 13 * 20


def test_one_flooding_user_is_refused_before_everyone_else() -> None:
    cache = ReplayCache(capacity=1000, per_owner=250)
    verifier = KeyVerifier(MASTER, replay=cache)
    signer = KeySigner(LOGIN)
    for _ in range(250):
        verifier.verify(signer.sign(666, 666, now=NOW), NOW)
    with pytest.raises(LimitReached, match="one caller"):
        verifier.verify(signer.sign(666, 666, now=NOW), NOW)
    assert verifier.verify(signer.sign(1000, 1000, now=NOW), NOW).uid == 1000
    node = KeySigner(NODE_A)
    assert verifier.verify(node.sign(0, 0, node="gpu-a", now=NOW), NOW).node == "gpu-a"


def test_a_refused_token_takes_no_room_in_the_replay_cache() -> None:
    cache = ReplayCache(capacity=1000)
    verifier = KeyVerifier(MASTER, replay=cache)
    token = KeySigner(LOGIN).sign(1000, 1000, now=NOW)
    for bad in (token[:-1] + ("A" if token[-1] != "A" else "B"), token + "x"):
        with pytest.raises(AuthError):
            verifier.verify(bad, NOW)
    assert len(cache) == 0
