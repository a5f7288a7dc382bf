"""[controller.retention]: every key bounded, each bad value one error naming the key;
the archive directory is made private, and one others could write is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpusched.config import RetentionConfig, load_config, parse_config
from gpusched.controller.retention import ArchiveShelf
from gpusched.errors import ConfigError


def retention_of(table: str, tmp_path: Path) -> RetentionConfig:
    path = tmp_path / "gpusched.toml"
    path.write_text(f"[controller.retention]\n{table}\n")
    return load_config(path).controller.retention


def test_off_by_default() -> None:
    settings = parse_config({}, "t").controller.retention
    assert settings == RetentionConfig()
    assert settings.purge_after is None and settings.archive


def test_the_values_written(tmp_path: Path) -> None:
    settings = retention_of('purge_job_after = "30-00:00:00"\narchive_jobs = false\n'
                            'archive_dir = "/srv/archive"\ninterval = 600\nbatch_size = 5000',
                            tmp_path)
    assert settings == RetentionConfig(purge_after=30 * 86_400, archive=False,
                                       archive_dir=Path("/srv/archive"), interval=600.0,
                                       batch_size=5000)
    assert retention_of('purge_job_after = "UNLIMITED"', tmp_path).purge_after is None
    assert retention_of('purge_job_after = "1:00:00"', tmp_path).purge_after == 3600


@pytest.mark.parametrize(("line", "key", "expected"), [
    ('purge_job_after = "59:00"', "purge_job_after", "from 1:00:00"),
    ('purge_job_after = "36501-00:00:00"', "purge_job_after", "to 36500-00:00:00"),
    ('purge_job_after = 86400', "purge_job_after", "a time such as"),
    ('purge_job_after = "a month"', "purge_job_after", "a time such as"),
    ('purge_job_after = "0"', "purge_job_after", "a time such as"),
    ("archive_jobs = 1", "archive_jobs", "true or false"),
    ('archive_dir = "archive"', "archive_dir", "an absolute path"),
    ('archive_dir = "/a\\u0000b"', "archive_dir", "no NUL"),
    ("interval = 0", "interval", "1 to 86400 seconds"),
    ("interval = 86401", "interval", "1 to 86400 seconds"),
    ("interval = nan", "interval", "1 to 86400 seconds"),
    ('interval = "1h"', "interval", "1 to 86400 seconds"),
    ("batch_size = 0", "batch_size", "1 to 10000 jobs"),
    ("batch_size = 10001", "batch_size", "1 to 10000 jobs"),
    ("batch_size = 10.5", "batch_size", "1 to 10000 jobs"),
    ("batch_size = true", "batch_size", "1 to 10000 jobs"),
    ("purge_after = 3600", "purge_after", "unknown key"),
])
def test_a_bad_value_is_one_error_naming_the_key(tmp_path: Path, line: str, key: str,
                                                 expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        retention_of(line, tmp_path)
    message = str(info.value)
    assert f"controller.retention.{key}" in message and expected in message, message
    assert "\n" not in message


def test_retention_must_be_a_table(tmp_path: Path) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_text("[controller]\nretention = 5\n")
    with pytest.raises(ConfigError, match="controller.retention: expected a table"):
        load_config(path)


def test_the_archive_directory_is_made_private(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "archive"
    ArchiveShelf(directory).prepare()
    info = directory.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()


@pytest.mark.parametrize("how", ["group-writable", "another owner", "a file", "a symlink"])
def test_an_archive_directory_others_could_write_is_refused(tmp_path: Path, how: str) -> None:
    directory = tmp_path / "archive"
    if how == "a file":
        directory.write_text("")
    elif how == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "elsewhere")
    else:
        directory.mkdir(mode=0o700)
        if how == "group-writable":
            directory.chmod(0o770)
        else:
            os.chown(directory, 65534, 65534)
    with pytest.raises(ConfigError) as info:
        ArchiveShelf(directory).prepare()
    assert "controller.retention.archive_dir" in str(info.value)
