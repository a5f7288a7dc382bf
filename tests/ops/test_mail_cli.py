"""gsubmit's --mail-type/--mail-user: parsed as options and #SBATCH lines (the command
line wins), checked before anything is sent, and put in the POST /v1/jobs body that
gpusched.messages.JobRequest parses back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.main import get_command

from gpusched.cli import gsubmit
from gpusched.cli.common import use_light_coercion
from gpusched.errors import UsageError
from gpusched.messages import JobRequest


def parse_submit(args: Sequence[str]) -> gsubmit.Submission:
    command = get_command(gsubmit.app)
    use_light_coercion(command)
    with command.make_context("gsubmit", list(args)) as ctx:
        return gsubmit.resolve_submission(ctx)  # type: ignore[arg-type]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def body(sub: gsubmit.Submission) -> dict[str, object]:
    return gsubmit.submission_body(sub, work_dir="/tmp", environment={})


def test_directives_and_options(in_tmp: Path) -> None:
    (in_tmp / "job.sh").write_text("#!/bin/sh\n#SBATCH --mail-type=end,FAIL\n"
                                   "#SBATCH --mail-user=ada@example.org\ntrue\n")
    sub = parse_submit(["job.sh"])
    assert (sub.mail_types, sub.mail_user, sub.ignored) == (("END", "FAIL"), "ada@example.org", ())
    request = JobRequest.parse(body(sub))
    assert (request.mail_types, request.mail_user) == (("END", "FAIL"), "ada@example.org")
    sub = parse_submit(["--mail-type=ALL,TIME_LIMIT_90", "--mail-user", "bob", "job.sh"])
    assert sub.mail_types == ("BEGIN", "END", "FAIL", "REQUEUE", "INVALID_DEPEND", "STAGE_OUT",
                              "TIME_LIMIT_90")
    assert body(sub)["mail_user"] == "bob"


def test_no_mail_options_leave_the_body_as_before(in_tmp: Path) -> None:
    sub = parse_submit(["--wrap", "true"])
    assert "mail_type" not in body(sub) and "mail_user" not in body(sub)
    assert JobRequest.parse(body(sub)).mail_types == ()
    assert body(parse_submit(["--mail-type=NONE,END", "--wrap", "true"]))["mail_type"] == []


def test_a_mail_user_alone_is_kept_with_a_warning(in_tmp: Path) -> None:
    sub = parse_submit(["--mail-user=ada", "--wrap", "true"])
    assert sub.ignored == ("--mail-user: no --mail-type is given, so no mail is sent",)


@pytest.mark.parametrize(("args", "said"), [
    (["--mail-type=EVERYTHING"], "--mail-type: invalid mail type 'EVERYTHING'"),
    (["--mail-type=END", "--mail-user=a@b\r\nBcc: c@d"], "--mail-user: invalid mail user "
                                                         "'a@b\\r\\nBcc: c@d'"),
    (["--mail-type=END", "--mail-user=a@b,c@d"], "--mail-user: invalid mail user 'a@b,c@d'"),
])
def test_bad_values_are_one_usage_error(in_tmp: Path, args: list[str], said: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_submit([*args, "--wrap", "true"])
    assert refused.value.message.startswith(said), refused.value.message
    assert "\n" not in refused.value.message and "\r" not in refused.value.message


def test_a_bad_directive_names_its_line(in_tmp: Path) -> None:
    (in_tmp / "job.sh").write_text("#!/bin/sh\n#SBATCH --mail-type=END\n"
                                   "#SBATCH --mail-user=-oQ/tmp/x@example.org\ntrue\n")
    with pytest.raises(UsageError) as refused:
        parse_submit(["job.sh"])
    assert refused.value.message.startswith("line 3: #SBATCH: --mail-user: invalid mail user")
