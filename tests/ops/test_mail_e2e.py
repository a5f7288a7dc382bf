"""Mail about jobs on a real local cluster (controller and agent processes, PostgreSQL):
sbatch's --mail-type/--mail-user through gsubmit, #SBATCH lines and POST /v1/jobs,
delivered to an SMTP sink written here with the standard library, or to a fake
``sendmail`` program; refusals at submit store nothing; a failover sends no mail twice."""

from __future__ import annotations

import base64
import email
import email.policy
import json
import signal
import socketserver
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.dbview import query
from tests.pg import ScratchPostgres


class _SmtpSession(socketserver.StreamRequestHandler):
    """One client's SMTP session: EHLO, AUTH PLAIN (when the server has a password),
    MAIL, RCPT, DATA, RSET, NOOP, QUIT."""

    server: _SinkServer

    def reply(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self) -> None:
        self.reply("220 sink ESMTP")
        sender, recipients = "", []
        while line := self.rfile.readline(65536):
            command = line.decode("ascii", "replace").rstrip("\r\n")
            verb = command.split(" ", 1)[0].upper()
            if verb == "EHLO":
                auth = b"250-AUTH PLAIN\r\n" if self.server.password else b""
                self.wfile.write(b"250-sink\r\n" + auth + b"250 8BITMIME\r\n")
            elif verb == "AUTH":
                given = base64.b64decode(command.split()[-1]).split(b"\0")
                with self.server.lock:
                    self.server.logins.append(b":".join(given[1:]).decode())
                ok = given[1:] == [b"gpusched", self.server.password.encode()]
                self.reply("235 welcome" if ok else "535 no")
            elif verb == "MAIL":
                sender, recipients = command.split(":", 1)[1].strip().strip("<>"), []
                self.reply("250 ok")
            elif verb == "RCPT":
                to = command.split(":", 1)[1].strip().strip("<>")
                recipients.append(to)
                self.reply("250 ok")
            elif verb == "DATA":
                self.reply("354 go on")
                data = bytearray()
                while (part := self.rfile.readline(65536)) not in (b".\r\n", b""):
                    data += part[1:] if part.startswith(b"..") else part
                message = email.message_from_bytes(bytes(data), policy=email.policy.default)
                with self.server.lock:
                    self.server.received.append((sender, list(recipients), message))
                self.reply("250 queued")
            elif verb in ("RSET", "NOOP", "HELO"):
                self.reply("250 ok")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 not here")


class _SinkServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    received: list[tuple[str, list[str], EmailMessage]]
    lock: threading.Lock
    password: str  # AUTH PLAIN for user gpusched with it; "": no AUTH offered
    logins: list[str]


class SmtpSink:
    """An SMTP server on 127.0.0.1 that keeps every message it is given."""

    def __init__(self, password: str = "") -> None:
        self.server = _SinkServer(("127.0.0.1", 0), _SmtpSession)
        self.server.received, self.server.lock = [], threading.Lock()
        self.server.password, self.server.logins = password, []
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def messages(self) -> list[tuple[str, list[str], EmailMessage]]:
        with self.server.lock:
            return list(self.server.received)

    def about(self, job_id: int) -> list[tuple[list[str], str]]:
        """(recipients, subject) of every message about job ``job_id``."""
        marks = (f"Job_id={job_id} ", f"Job_id={job_id}_", f"({job_id}) ")
        return [(to, str(m["Subject"])) for _, to, m in self.messages()
                if any(mark in str(m["Subject"]) for mark in marks)]

    def wait(self, job_id: int, count: int, timeout: float = 30.0) -> list[tuple[list[str], str]]:
        return wait_for(lambda: len(self.about(job_id)) >= count and self.about(job_id),
                        timeout, f"{count} mail(s) about job {job_id}",
                        seen=lambda: [str(m["Subject"]) for _, _, m in self.messages()])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _mail_toml(**keys: object) -> str:
    """A [mail] table, written after the [controller] keys (TOML starts a new table)."""
    return "\n[mail]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


@pytest.fixture(scope="module")
def smtp_cluster(postgres: ScratchPostgres) -> Iterator[tuple[Cluster, SmtpSink, str]]:
    """A cluster whose controller mails through the sink, bare names @example.org."""
    sink = SmtpSink()
    url = postgres.fresh_database()
    cluster = Cluster(url, gpus=4, kill_grace=1.0, controller_toml=_mail_toml(
        method="smtp", smtp_host="127.0.0.1", smtp_port=sink.port, domain="example.org",
        interval=0.3, retry_after=1, max_attempts=2))
    try:
        yield cluster.up(), sink, url
    finally:
        cluster.close()
        sink.close()


def _jobs(url: str) -> int:
    return int(query(url, "SELECT count(*) FROM jobs")[0][0])


def test_begin_and_end_mail_the_named_user(smtp_cluster: tuple[Cluster, SmtpSink, str]) -> None:
    cluster, sink, url = smtp_cluster
    job = cluster.submit("--mail-type=BEGIN,END", "--mail-user=ada@lab.example.org",
                         "-J", "train", "--wrap", "sleep 1")
    cluster.wait_state(job, "COMPLETED")
    mails = sink.wait(job, 2)
    assert [to for to, _ in mails] == [["ada@lab.example.org"]] * 2
    subjects = sorted(s for _, s in mails)
    assert subjects[0].startswith(f"gpusched Job_id={job} Name=train Began, Queued time 00:00:0")
    assert subjects[1].startswith(f"gpusched Job_id={job} Name=train Ended, Run time 00:00:0")
    assert subjects[1].endswith(", COMPLETED, ExitCode 0")
    assert query(url, "SELECT mail_types, mail_user FROM jobs WHERE id = :j", j=job) == [
        (["BEGIN", "END"], "ada@lab.example.org")]
    assert query(url, "SELECT event, state, attempts FROM mail_events WHERE job_id = :j "
                 "ORDER BY event", j=job) == [("BEGIN", "sent", 1), ("END", "sent", 1)]


def test_a_failed_job_mails_fail_not_end_to_the_submitting_user(
        smtp_cluster: tuple[Cluster, SmtpSink, str]) -> None:
    cluster, sink, _ = smtp_cluster
    script = cluster.work / "fails.sh"
    script.write_text("#!/bin/sh\n#SBATCH --mail-type=END,FAIL\n#SBATCH -J broken\nexit 3\n")
    job = cluster.submit(str(script))
    cluster.wait_state(job, "FAILED")
    (to, subject), = sink.wait(job, 1)
    assert to == ["root@example.org"]  # no --mail-user: the submitter, at the mail domain
    assert subject.startswith(f"gpusched Job_id={job} Name=broken Failed, Run time ")
    assert subject.endswith(", FAILED, ExitCode 3")


def test_time_limit_50_then_time_limit(smtp_cluster: tuple[Cluster, SmtpSink, str]) -> None:
    cluster, sink, _ = smtp_cluster
    job = cluster.submit("--time=0:06", "--mail-type=TIME_LIMIT_50,TIME_LIMIT",
                         "--wrap", "sleep 60")
    (_, half), = sink.wait(job, 1)
    assert cluster.job(job)["state"] == "RUNNING"  # it came at half time, before the end
    assert half.startswith(f"gpusched Job_id={job} Name=wrap Reached 50% of time limit, "
                           "Run time 00:00:0")
    cluster.wait_state(job, "TIMEOUT")
    mails = sink.wait(job, 2)
    assert [s for _, s in mails][1].startswith(
        f"gpusched Job_id={job} Name=wrap Reached time limit, Run time 00:00:0")


def test_requeue_mails_requeue_and_each_begin(smtp_cluster: tuple[Cluster, SmtpSink, str]) -> None:
    cluster, sink, url = smtp_cluster
    job = cluster.submit("--mail-type=BEGIN,REQUEUE", "--mail-user=ada", "--wrap", "sleep 60")
    cluster.wait_state(job, "RUNNING")
    sink.wait(job, 1)
    result = cluster.run("gcontrol", "requeue", str(job))
    assert result.returncode == 0, result.stderr
    wait_for(lambda: cluster.job(job)["state"] == "RUNNING"
             and query(url, "SELECT restarts FROM jobs WHERE id = :j", j=job) == [(1,)],
             what="the job running again")
    mails = sink.wait(job, 3)
    subjects = [s.split(", Queued time")[0] for _, s in mails]
    assert sorted(subjects) == [f"gpusched Job_id={job} Name=wrap Began"] * 2 + [
        f"gpusched Job_id={job} Name=wrap Requeued, Restarts 1"]
    assert {tuple(to) for to, _ in mails} == {("ada@example.org",)}
    assert query(url, "SELECT run, event FROM mail_events WHERE job_id = :j ORDER BY run, event",
                 j=job) == [(0, "BEGIN"), (0, "REQUEUE"), (1, "BEGIN")]
    assert cluster.run("gcancel", str(job)).returncode == 0


def test_arrays_mail_once_unless_array_tasks(smtp_cluster: tuple[Cluster, SmtpSink, str]) -> None:
    cluster, sink, url = smtp_cluster
    whole = cluster.submit("--array=0-2", "--mail-type=END", "-J", "sweep", "--wrap", "true")
    tasks = cluster.submit("--array=0-2", "--mail-type=END,ARRAY_TASKS", "-J", "sweep",
                           "--wrap", "true")
    per_task = sink.wait(tasks, 3)
    assert sorted(s.split(" (")[0] for _, s in per_task) == [
        f"gpusched Array Task Job_id={tasks}_{t}" for t in range(3)]
    assert all(s.endswith(", COMPLETED, ExitCode 0") and " Name=sweep Ended, Run time " in s
               for _, s in per_task), per_task
    (_, summary), = sink.wait(whole, 1)
    assert summary == (f"gpusched Array Summary Job_id={whole}_* ({whole}) Name=sweep Ended, "
                       "COMPLETED, ExitCode [0-0]")
    for array in (whole, tasks):
        wait_for(lambda a=array: query(url, "SELECT mail_done_at IS NOT NULL FROM jobs "  # type: ignore[misc]
                                       "WHERE id = :a", a=a) == [(True,)], what="done")
    assert query(url, "SELECT job_id, run, event FROM mail_events WHERE job_id IN (SELECT id "
                 "FROM jobs WHERE array_job_id = :a)", a=whole) == [(whole, 0, "END")]
    assert len(sink.about(whole)) == 1 and len(sink.about(tasks)) == 3


def test_none_sends_nothing(smtp_cluster: tuple[Cluster, SmtpSink, str]) -> None:
    cluster, sink, url = smtp_cluster
    quiet = cluster.submit("--mail-type=END,NONE", "--mail-user=ada@example.org",
                           "--wrap", "true")
    cluster.wait_state(quiet, "COMPLETED")
    # A later job's mail: the rounds that sent it had the quiet job's end to mail too.
    later = cluster.submit("--mail-type=END", "--wrap", "true")
    sink.wait(later, 1)
    assert sink.about(quiet) == []
    assert query(url, "SELECT mail_types, mail_user FROM jobs WHERE id = :j", j=quiet) == [
        (None, None)]
    assert query(url, "SELECT count(*) FROM mail_events WHERE job_id = :j", j=quiet) == [(0,)]


@pytest.mark.parametrize("option", [
    "--mail-user=ada@example.org\r\nBcc: eve@example.net",
    "--mail-user=ada@example.org,eve@example.net",
    "--mail-user=-oQ/tmp/x@example.org",
    "--mail-user=ada@exa mple.org",
    "--mail-user=" + "a" * 250 + "@example.org",
    "--mail-type=END,EVERYTHING",
    "--mail-type=END\nBEGIN",
])
def test_bad_mail_options_are_refused_and_store_nothing(
        smtp_cluster: tuple[Cluster, SmtpSink, str], option: str) -> None:
    cluster, _, url = smtp_cluster
    before = _jobs(url)
    result = cluster.run("gsubmit", "--mail-type=END", option, "--wrap", "true")
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "mail" in lines[0].lower(), result.stderr
    assert "\r" not in result.stderr
    assert _jobs(url) == before


@pytest.mark.parametrize("fields", [
    {"mail_type": ["END"], "mail_user": "ada@example.org\r\nBcc: eve@example.net"},
    {"mail_type": ["END"], "mail_user": "ada@example.org\nSubject: hi"},
    {"mail_type": ["END"], "mail_user": "ada\u2028@example.org"},
    {"mail_type": ["END\r\nBcc: eve@example.net"]},
    {"mail_type": "END"},
    {"mail_type": ["END"] * 20},
    {"mail_type": ["END"], "mail_user": ["ada@example.org"]},
])
def test_the_api_refuses_bad_mail_fields_with_one_error(
        smtp_cluster: tuple[Cluster, SmtpSink, str], fields: dict[str, object]) -> None:
    cluster, _, url = smtp_cluster
    before = _jobs(url)
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work), **fields}
    with pytest.raises(Exception) as refused:
        cluster.api("POST", "/v1/jobs", body)
    message = str(refused.value)
    assert "mail" in message and "\n" not in message and "\r" not in message
    assert _jobs(url) == before


def test_sendmail_mode_and_bounded_retries(postgres: ScratchPostgres, tmp_path: Path) -> None:
    """The local sendmail program (a fake that keeps what it is given, and refuses one
    recipient): the recipient after '--', the message on stdin; a refused mail is tried
    max_attempts times, logged once, and the controller carries on."""
    url = postgres.fresh_database()
    box = tmp_path / "box"
    box.mkdir()
    fake = tmp_path / "sendmail"
    fake.write_text(f"""#!/bin/sh
n=$(date +%s%N)
case "$*" in *bounce*) echo "no such user" >&2; exit 67;; esac
printf '%s\\n' "$@" > {box}/$n.args
cat > {box}/$n.msg
""")
    fake.chmod(0o755)
    cluster = Cluster(url, gpus=2, controller_toml=_mail_toml(
        method="sendmail", sendmail=str(fake), domain="example.org", interval=0.3,
        retry_after=1, max_attempts=2, **{"from": "hpc-noreply@example.org"}))
    try:
        cluster.up()
        bounced = cluster.submit("--mail-type=END", "--mail-user=bounce@example.org",
                                 "--wrap", "true")
        job = cluster.submit("--mail-type=END", "--mail-user=ada@example.org", "-J", "eval",
                             "--wrap", "true")
        wait_for(lambda: query(url, "SELECT state, attempts FROM mail_events WHERE job_id = :j",
                               j=bounced) == [("failed", 2)], timeout=30,
                 what="the bounced mail given up", seen=cluster.logs)
        wait_for(lambda: list(box.glob("*.msg")), what="ada's mail")
        (args,) = [p.read_text().splitlines() for p in box.glob("*.args")]
        assert args == ["-oi", "-f", "hpc-noreply@example.org", "--", "ada@example.org"]
        (sent,) = [email.message_from_bytes(p.read_bytes(), policy=email.policy.default)
                   for p in box.glob("*.msg")]
        assert sent["Subject"].startswith(f"gpusched Job_id={job} Name=eval Ended, Run time 00:")
        assert sent["Subject"].endswith(", COMPLETED, ExitCode 0")
        assert (sent["To"], sent["From"]) == ("ada@example.org", "hpc-noreply@example.org")
        assert f"Job id: {job}" in sent.get_content()
        log = (cluster.root / "controller.log").read_text()
        assert log.count(f"mail about job {bounced} (END)") == 1, log[-3000:]  # rate-limited
        assert "exited with status 67: no such user" in log
        assert cluster.try_api("GET", "/v1/ping")  # the controller carries on
    finally:
        cluster.close()


def test_a_failover_neither_loses_nor_repeats_mail(postgres: ScratchPostgres) -> None:
    """The leader is killed while a job runs; the standby takes over and sends its END
    mail (the killed controller comes back as a standby, for the agent to reach); BEGIN,
    sent by the first leader, is not sent again."""
    sink = SmtpSink()
    url = postgres.fresh_database()
    cluster = Cluster(url, gpus=2, poll_wait=2.0, controller_toml=_mail_toml(
        method="smtp", smtp_host="127.0.0.1", smtp_port=sink.port, domain="example.org",
        interval=0.3))
    try:
        cluster.up()
        standby = cluster.start_standby()
        wait_for(lambda: cluster.try_api("GET", "/v1/ping", socket=standby), what="standby")
        job = cluster.submit("--mail-type=BEGIN,END", "--wrap", "sleep 4")
        sink.wait(job, 1)
        first = cluster.procs["controller"].pid
        cluster.kill("controller", signal.SIGKILL)
        wait_for(lambda: not str(query(url, "SELECT holder FROM leader")[0][0]).endswith(
            f":{first}"), timeout=30, what="the standby to lead")
        cluster.start("controller")
        cluster.wait_controller()
        cluster.wait_state(job, "COMPLETED", timeout=40)
        mails = sink.wait(job, 2, timeout=40)
        assert sorted(s.split(",")[0] for _, s in mails) == [
            f"gpusched Job_id={job} Name=wrap Began", f"gpusched Job_id={job} Name=wrap Ended"]
        later = cluster.submit("--mail-type=END", "--wrap", "true")
        sink.wait(later, 1)
        assert len(sink.about(job)) == 2
    finally:
        cluster.close()
        sink.close()
