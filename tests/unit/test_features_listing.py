"""Features in the listings: gqueue's %f (and -O Feature) shows a job's constraint,
ginfo's %f/%b (and -O Features) a node group's features."""

from __future__ import annotations

from datetime import datetime

from gpusched.cli import infoformat, queueformat
from gpusched.cli.ginfo import NodeSummary


def test_gqueue_shows_the_constraint() -> None:
    fields = queueformat.parse_format("%i %f")
    now = datetime.now()
    assert queueformat.render_format(fields, {"job_id": 7, "display_id": "7",
                                              "constraint": "a100&[r1|r2]"}, now) == "7 a100&[r1|r2]"
    assert queueformat.render_format(fields, {"job_id": 8, "display_id": "8"}, now) == "8 (null)"
    assert queueformat.render_format(fields, None, now) == "JOBID FEATURES"
    assert queueformat.parse_long_format("feature") == queueformat.parse_long_format("Feature")


def test_ginfo_shows_the_features_of_a_group() -> None:
    nodes = [NodeSummary("n1", "idle", features=["rack1", "l4"]),
             NodeSummary("n2", "idle", features=["rack2", "l4"]), NodeSummary("n3", "idle")]
    row = infoformat.InfoRow({"name": "gpu"}, "idle", nodes)
    assert infoformat.render(infoformat.parse_format("%f|%b"), row) == "l4,rack1,rack2|l4,rack1,rack2"
    bare = infoformat.InfoRow({"name": "gpu"}, "idle", nodes[2:])
    assert infoformat.render(infoformat.parse_format("%f"), bare) == "(null)"
    assert infoformat.render(infoformat.parse_format("%f %b"), None) == "AVAIL_FEATURES ACTIVE_FEATURES"
    assert [p[0] for p in infoformat.parse_long_format("Features,FeaturesAct")][::2] == ["f", "b"]


def test_gacct_shows_the_constraint() -> None:
    from gpusched.cli import acctformat

    header, value = acctformat.FIELDS["constraints"]
    assert header == "Constraints"
    assert value(({"constraint": "sm_90|sm_89"}, None)) == "sm_90|sm_89"
    assert value(({"constraint": None}, None)) == ""
    assert value(({"constraint": "a"}, {"step": 0})) == ""  # steps: the job's line only
