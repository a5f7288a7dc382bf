"""Administrators: root, or members of [controller] admin_group in this host's group
database; a credential's gid alone makes no one an administrator."""

from __future__ import annotations

import grp
import subprocess

import pytest

from gpusched.auth.admins import AdminPolicy
from tests.security.conftest import LocalUser, ensure_user

ADMINS = "gpusched-test-admins"


@pytest.fixture(scope="module")
def admin_group(attackers: tuple[LocalUser, LocalUser]) -> int:
    """A real group whose only member is alice (the second test user)."""
    _, alice = attackers
    try:
        grp.getgrnam(ADMINS)
    except KeyError:
        subprocess.run(["groupadd", "--system", ADMINS], check=True, capture_output=True)
    subprocess.run(["gpasswd", "-M", alice.name, ADMINS], check=True, capture_output=True)
    return grp.getgrnam(ADMINS).gr_gid


def test_root_is_always_an_admin() -> None:
    assert AdminPolicy(None).is_admin(0, 0)
    assert AdminPolicy(ADMINS).is_admin(0, 12345)


def test_without_an_admin_group_only_root_is(attackers: tuple[LocalUser, LocalUser],
                                            admin_group: int) -> None:
    _, alice = attackers
    assert not AdminPolicy(None).is_admin(alice.uid, alice.gid)


def test_a_member_of_the_admin_group_is_an_admin(attackers: tuple[LocalUser, LocalUser],
                                                 admin_group: int) -> None:
    mallory, alice = attackers
    policy = AdminPolicy(ADMINS)
    assert policy.is_admin(alice.uid, alice.gid)
    assert not policy.is_admin(mallory.uid, mallory.gid)


def test_a_gid_alone_does_not_make_an_admin(attackers: tuple[LocalUser, LocalUser],
                                            admin_group: int) -> None:
    """mallory running a program setgid to the admin group is still not an admin."""
    mallory, _ = attackers
    assert not AdminPolicy(ADMINS).is_admin(mallory.uid, admin_group)


def test_an_unknown_group_or_user_makes_no_admin(attackers: tuple[LocalUser, LocalUser]) -> None:
    _, alice = attackers
    assert not AdminPolicy("no-such-group-here").is_admin(alice.uid, alice.gid)
    assert not AdminPolicy(ADMINS).is_admin(3_999_999_999, 3_999_999_999)


def test_membership_is_cached_for_a_while_then_looked_up_again(
        attackers: tuple[LocalUser, LocalUser], admin_group: int) -> None:
    _, alice = attackers
    newcomer = ensure_user("gpusched-test-adm")  # its own user: no other test sees it change
    policy = AdminPolicy(ADMINS, cache_seconds=60)
    assert not policy.is_admin(newcomer.uid, newcomer.gid, now=1000.0)
    subprocess.run(["gpasswd", "-M", f"{alice.name},{newcomer.name}", ADMINS], check=True,
                   capture_output=True)
    try:
        assert not policy.is_admin(newcomer.uid, newcomer.gid, now=1030.0)
        assert policy.is_admin(newcomer.uid, newcomer.gid, now=1061.0)
    finally:
        subprocess.run(["gpasswd", "-M", alice.name, ADMINS], check=True, capture_output=True)
    assert not AdminPolicy(ADMINS).is_admin(newcomer.uid, newcomer.gid)


def test_user_names_are_looked_up_and_cached_for_a_while(
        attackers: tuple[LocalUser, LocalUser]) -> None:
    """A uid's login name, from the user database; a uid without one is its number; a
    name changed meanwhile shows once the cache entry has aged."""
    _, alice = attackers
    renamed = ensure_user("gpusched-test-ren")
    policy = AdminPolicy(None, cache_seconds=60)
    assert policy.user_name(alice.uid, now=0.0) == alice.name
    assert policy.user_name(3_999_999_999, now=0.0) == "3999999999"
    assert policy.user_name(renamed.uid, now=1000.0) == "gpusched-test-ren"
    subprocess.run(["usermod", "-l", "gpusched-test-re2", "gpusched-test-ren"], check=True,
                   capture_output=True)
    try:
        assert policy.user_name(renamed.uid, now=1030.0) == "gpusched-test-ren"
        assert policy.user_name(renamed.uid, now=1061.0) == "gpusched-test-re2"
    finally:
        subprocess.run(["usermod", "-l", "gpusched-test-ren", "gpusched-test-re2"],
                       check=True, capture_output=True)
