"""Key files: written 0600 by 'gpusched auth keygen' and 'derive', refused unless a
regular file owned by root (or the reader) that only its owner can read."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpusched.auth.keys import (
    derive_host_key,
    read_host_key,
    read_master_key,
    render_host_key,
    render_master_key,
    write_key_file,
)
from gpusched.errors import ConfigError, UsageError
from tests.security.conftest import LocalUser

GPUSCHED = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "gpusched"


def gpusched(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUSCHED), *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture
def master_file(tmp_path: Path) -> Path:
    path = tmp_path / "master.key"
    done = gpusched("auth", "keygen", "-o", str(path))
    assert done.returncode == 0, done.stderr
    return path


def test_keygen_writes_a_master_key_readable_by_its_owner_only(master_file: Path) -> None:
    st = os.lstat(master_file)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    key = read_master_key(master_file)
    assert len(key.secret) == 32 and key.key_id in master_file.read_text()
    assert key.secret.hex() not in repr(key)


def test_keygen_does_not_replace_a_key_without_force(master_file: Path) -> None:
    before = master_file.read_text()
    done = gpusched("auth", "keygen", "-o", str(master_file))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "already exists" in done.stderr
    assert master_file.read_text() == before
    assert gpusched("auth", "keygen", "-o", str(master_file), "--force").returncode == 0
    assert read_master_key(master_file).key_id not in before
    assert stat.S_IMODE(os.lstat(master_file).st_mode) == 0o600


def test_derive_writes_the_host_key_of_that_host(master_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu01.key"
    done = gpusched("auth", "derive", "--host", "gpu01", "--key-file", str(master_file),
                    "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.lstat(out).st_mode) == 0o600
    host = read_host_key(out)
    assert host == derive_host_key(read_master_key(master_file), "gpu01")
    printed = gpusched("auth", "derive", "--host", "gpu01", "--key-file", str(master_file),
                       "-o", "-")
    assert printed.stdout == out.read_text()
    other = gpusched("auth", "derive", "--host", "gpu02", "--key-file", str(master_file),
                     "-o", "-")
    assert other.returncode == 0 and other.stdout != printed.stdout


@pytest.mark.parametrize("host", ["gpu 01", "-gpu", "", "a" * 254, "gpu01;rm"])
def test_derive_refuses_a_bad_host_name(master_file: Path, tmp_path: Path, host: str) -> None:
    done = gpusched("auth", "derive", "--host", host, "--key-file", str(master_file),
                    "-o", str(tmp_path / "x.key"))
    assert done.returncode == 2, done.stderr
    assert "invalid host name" in done.stderr and done.stderr.strip().count("\n") == 0
    assert not (tmp_path / "x.key").exists()


def test_a_key_file_readable_by_others_is_refused(master_file: Path) -> None:
    os.chmod(master_file, 0o644)
    with pytest.raises(ConfigError, match="has mode 0644; .*chmod 0600"):
        read_master_key(master_file)
    os.chmod(master_file, 0o640)
    with pytest.raises(ConfigError, match="has mode 0640"):
        read_master_key(master_file)


def test_a_symlinked_key_file_is_refused(master_file: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.key"
    link.symlink_to(master_file)
    with pytest.raises(ConfigError, match="symbolic link"):
        read_master_key(link)


def test_a_key_file_owned_by_another_user_is_refused(
        master_file: Path, attackers: tuple[LocalUser, LocalUser]) -> None:
    os.chown(master_file, attackers[0].uid, attackers[0].gid)
    with pytest.raises(ConfigError, match=f"owned by uid {attackers[0].uid}"):
        read_master_key(master_file)


def test_a_directory_or_missing_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir.key").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_master_key(tmp_path / "dir.key")
    with pytest.raises(ConfigError, match="no such key file"):
        read_master_key(tmp_path / "missing.key")


def write_raw(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, data)
    os.close(fd)
    return path


@pytest.mark.parametrize("mangle, message", [
    (lambda t: t.replace("kind = master", "kind = host"), "not a master key"),
    (lambda t: "hello\n", "not a gpusched key file"),
    (lambda t: t + "extra = 1\n", "unexpected line"),
    (lambda t: t + "kind = master\n", "unexpected line"),
    (lambda t: t.replace("key_id = ", "key_id = 0"), "key_id: expected 16"),
    (lambda t: t.replace("secret = ", "secret = !"), "secret: expected base64"),
    (lambda t: t + "#" * 5000, "over 4096 bytes"),
])
def test_a_damaged_master_key_file_is_refused(master_file: Path, mangle: object,
                                              message: str) -> None:
    text = master_file.read_text()
    write_raw(master_file, mangle(text).encode())  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message):
        read_master_key(master_file)


def test_a_master_key_whose_id_does_not_match_its_secret_is_refused(master_file: Path) -> None:
    key = read_master_key(master_file)
    text = master_file.read_text().replace(key.key_id, "0123456789abcdef")
    write_raw(master_file, text.encode())
    with pytest.raises(ConfigError, match="does not match the secret"):
        read_master_key(master_file)


def test_a_master_key_is_not_a_host_key(master_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a host key"):
        read_host_key(master_file)
    host = derive_host_key(read_master_key(master_file), "gpu01")
    path = write_raw(tmp_path / "h.key", render_host_key(host).replace("gpu01", "gpu 01").encode())
    with pytest.raises(ConfigError, match="host: expected a host name"):
        read_host_key(path)


def test_write_key_file_never_replaces_without_asking(tmp_path: Path, master_file: Path) -> None:
    key = read_master_key(master_file)
    with pytest.raises(UsageError, match="already exists"):
        write_key_file(master_file, render_master_key(key))
    with pytest.raises(UsageError, match="no such directory"):
        write_key_file(tmp_path / "nowhere" / "k.key", render_master_key(key))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["master.key"]
