"""What a submission reads, in plain SQL built once and run on the driver's connection
of the session's transaction: one statement reads everything its checks need
(db/submit.py makes them, in their order); db/submit_store.py stores the job. An ORM
statement costs several times the CPU, and a submission made about ten."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from sqlalchemy.orm import Session

from gpusched.core.licenses import Licenses
from gpusched.db.associations import (
    ACCOUNT_TREE,
    DEFAULT_QOS,
    QUEUED,
    Association,
    QosRow,
    Queued,
    association,
    qos_row,
    queued,
)
from gpusched.db.engine import driver
from gpusched.db.licenses import check_licenses


class PartitionRow(NamedTuple):
    """What a submission reads of a partition."""

    name: str
    nodes: list[str]
    state: str
    max_time: int | None
    default_time: int | None
    max_gpus_per_job: int | None
    allow_accounts: list[str] | None
    deny_accounts: list[str]
    sharing: str | None  # how its GPUs are shared: "mps", "shard" or None (not at all)
    shares: int | None  # units each shared GPU offers
    dynamic_mig: bool = False  # whether its idle MIG GPUs may be re-partitioned


# The partition named, or (NULL) the default: the first not INACTIVE, default first.
_PARTITION = (
    "SELECT name, nodes, state, max_time, default_time, max_gpus_per_job, allow_accounts,"
    " deny_accounts, sharing, shares, dynamic_mig FROM partitions"
    " WHERE name = CAST(%(part)s AS text)"
    " OR (CAST(%(part)s AS text) IS NULL AND state <> 'INACTIVE')"
    " ORDER BY is_default DESC, name LIMIT 1")
# The registered nodes of a partition, as JSON [id, name, cpus, memory_mb, units] rows,
# units being [gpu_type, mig_profile, count, most memory_mb] rows of its present GPUs
# (NULL when none): whole GPUs and MIG slices, and the GPUs split into slices with the
# profile MIG_PARENT (what dynamic MIG may split them into again).
MIG_PARENT = "*"
_MEMBERS = (
    "(SELECT json_agg(json_build_array(n.id, n.name, n.cpus, n.memory_mb, ("
    "SELECT json_agg(json_build_array(u.gpu_type, u.mig_profile, u.units, u.memory_mb)"
    " ORDER BY u.gpu_type, u.mig_profile)"
    " FROM (SELECT gpu_type, CASE WHEN gpus.id IN (SELECT parent_id FROM gpus"
    f" WHERE parent_id IS NOT NULL AND present) THEN '{MIG_PARENT}' ELSE mig_profile END"
    " AS mig_profile, count(*) AS units, max(memory_mb) AS memory_mb"
    " FROM gpus WHERE gpus.node_id = n.id AND gpus.present GROUP BY 1, 2) AS u)) ORDER BY n.id)"
    " FROM nodes AS n WHERE '*' = ANY({nodes}) OR n.name = ANY({nodes}))")
_PARTITION_FACTS = (f"WITH part AS ({_PARTITION}) SELECT part.*, "
                    + _MEMBERS.format(nodes="part.nodes") + " FROM part")
# What a submission checks that depends only on whom it is of and what it asks for
# (%(part)s, %(user)s, %(account)s, %(qos)s), each JSON aggregate in a set order so that
# the same tables give the same text: the partition's row and its registered nodes; the
# user's associations ([account, is_default] rows) and whether any user has one; the
# association the job would charge (the one named, else the user's default) and what
# access_of wants of it; the QOS it would most likely get (the one named, else the
# association's default, else normal). FACTS_VERSION tells whether a former read of it
# still holds (db/submit_store.py).
STABLE = (
    f"part AS ({_PARTITION}), assoc AS (SELECT account, qos, default_qos,"
    " max_submit_jobs FROM account_users WHERE user_name = %(user)s"
    " AND (account = CAST(%(account)s AS text) OR CAST(%(account)s AS text) IS NULL)"
    ' ORDER BY NOT is_default, account COLLATE "C" LIMIT 1), asked AS ('
    f"SELECT COALESCE(CAST(%(qos)s AS text), assoc.default_qos, '{DEFAULT_QOS}') AS name"
    " FROM (SELECT) AS one LEFT JOIN assoc ON true), stable AS ("
    " SELECT part.name, part.nodes, part.state, part.max_time, part.default_time,"
    " part.max_gpus_per_job, part.allow_accounts, part.deny_accounts, part.sharing,"
    " part.shares, part.dynamic_mig, "
    + _MEMBERS.format(nodes="part.nodes") + " AS members,"
    " (SELECT json_agg(json_build_array(account, is_default) ORDER BY account)"
    "  FROM account_users WHERE user_name = %(user)s) AS mine,"
    " EXISTS (SELECT FROM account_users) AS anyone,"
    " assoc.account, assoc.qos AS assoc_qos, assoc.default_qos, assoc.max_submit_jobs,"
    " CASE WHEN assoc.account IS NOT NULL AND (assoc.qos IS NULL"
    f" OR assoc.default_qos IS NULL) THEN {ACCOUNT_TREE} END AS tree,"
    " asked.name AS qos_name, qos.max_wall, qos.max_submit_jobs_per_user,"
    " qos.name IS NOT NULL AS qos_found"
    " FROM (SELECT) AS one LEFT JOIN part ON true LEFT JOIN assoc ON true"
    " CROSS JOIN asked LEFT JOIN qos ON qos.name = asked.name)")
# The version of the stable facts (migration 0032: any change of what STABLE reads
# raises it), read in the statement that reads them.
FACTS_VERSION = "(SELECT version FROM submit_facts_version)"
# Everything else a submission checks, besides the stable facts: which of the nodes
# named are registered and which of the jobs named exist; the job this user stored with
# this submit key ([id, hold, reason]); and, when asked (under the user's lock), their
# jobs queued (see QUEUED) in all and in the QOS of ``qos_name``.
_FACTS = (
    f"WITH {STABLE} SELECT stable.*, {FACTS_VERSION},"
    " (SELECT array_agg(name) FROM nodes WHERE name = ANY(CAST(%(named)s AS text[]))),"
    " (SELECT array_agg(id) FROM jobs WHERE id = ANY(CAST(%(jobs)s AS bigint[]))),"
    " (SELECT json_build_array(id, hold, reason) FROM jobs WHERE uid = %(uid)s"
    "  AND submit_key = CAST(%(key)s AS text)),"
    " CASE WHEN %(count)s THEN " + QUEUED.format(qos="stable.qos_name") + " END"
    " FROM stable")


class PartitionFacts(NamedTuple):
    """A partition (None: no such one) and its registered nodes (see _MEMBERS); ``fits``:
    where these facts are kept for later submissions (submit_store.KnownFacts), the
    shapes found to fit on those nodes (submit._check_fits), so that a check costs
    O(nodes) once per shape, not once per submission."""

    partition: PartitionRow | None
    members: Sequence[Sequence[Any]]
    fits: dict[tuple[Any, ...], bool] | None = None


class Facts(NamedTuple):
    """What _FACTS reads: the stable facts (STABLE: ``first`` to ``qos``) and those read
    for each submission (``known_nodes`` to ``queued``). A submission checked against
    known facts (db/submit_known.py) has the latter checked by its statement instead
    (submit_store._GUARD): a fact added here that STABLE does not read needs its
    condition there too, or such submissions would be checked against an older one."""

    first: PartitionFacts  # of the first partition asked for
    mine: dict[str, bool]  # the user's accounts, and whether each is their default
    any_association: bool
    association: tuple[str, Association] | None  # account, the association with it
    qos: tuple[str, QosRow | None]  # a QOS's name, and the QOS (None: no such QOS)
    known_nodes: set[str]
    known_jobs: set[int]
    earlier: tuple[int, str | None, str] | None  # id, hold, reason
    queued: Queued | None  # when asked for: counted in all and in the QOS of ``qos``
    version: int | None = None  # FACTS_VERSION, read with the stable facts


def read_facts(session: Session, uid: int, user: str, partition: str | None,
               account: str | None, qos: str | None, named_nodes: set[str],
               named_jobs: set[int], submit_key: str | None, count: bool) -> Facts:
    """_FACTS, for a submission asking for ``partition`` (None: the default),
    ``account`` and ``qos`` (None: the defaults) and naming these nodes and jobs; the
    user's jobs are counted when ``count`` (under the user's lock)."""
    row = driver(session).execute(_FACTS, {
        "part": partition, "user": user, "account": account, "qos": qos,
        "named": list(named_nodes), "jobs": list(named_jobs), "uid": uid,
        "key": submit_key, "count": count}).fetchone()
    (*part, members, mine, anyone, assoc_account, assoc_qos, assoc_default, assoc_most,
     tree, qos_name, max_wall, qos_most, qos_found, version, nodes, jobs, earlier,
     counted) = row
    return Facts(
        PartitionFacts(None if part[0] is None else PartitionRow(*part), members or ()),
        {a: bool(default) for a, default in mine or ()}, bool(anyone),
        None if assoc_account is None else (
            assoc_account, Association(assoc_qos, assoc_default, assoc_most, tree)),
        (qos_name, QosRow(qos_name, max_wall, qos_most) if qos_found else None),
        set(nodes or ()), set(jobs or ()),
        None if earlier is None else (int(earlier[0]), earlier[1], earlier[2]),
        None if counted is None else queued(qos_name, counted), version)


def read_partition(session: Session, name: str | None,
                   members: bool = True) -> PartitionFacts:
    """The partition named (None: the default), and its registered nodes (none read
    unless ``members``)."""
    row = driver(session).execute(_PARTITION_FACTS if members else _PARTITION,
                                  {"part": name}).fetchone()
    if row is None:
        return PartitionFacts(None, ())
    width = len(PartitionRow._fields)
    return PartitionFacts(PartitionRow(*row[:width]), (row[width] or ()) if members else ())


class Reads(Protocol):
    """What a submission's checks read beyond the facts: in its transaction
    (SessionReads), or nothing where the facts known must be all (db/submit_known.py)."""

    def partition(self, name: str | None) -> PartitionFacts:
        """The partition named (None: the default) and its registered nodes."""

    def check_licenses(self, asked: Licenses) -> None:
        """Refuse licenses the cluster lacks."""

    def association(self, user: str, account: str) -> Association:
        """``user``'s association with ``account``."""

    def qos(self, name: str) -> QosRow | None:
        """The QOS named, if it exists."""

    def session(self) -> Session:
        """The submission's transaction, for the checks that read what no fact holds."""


class SessionReads:
    """Reads in the submission's transaction."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def partition(self, name: str | None) -> PartitionFacts:
        return read_partition(self._session, name)

    def check_licenses(self, asked: Licenses) -> None:
        check_licenses(self._session, asked)

    def association(self, user: str, account: str) -> Association:
        return association(self._session, user, account)

    def qos(self, name: str) -> QosRow | None:
        return qos_row(self._session, name)

    def session(self) -> Session:
        return self._session
