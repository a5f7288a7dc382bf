"""MIG layouts: which fit a GPU model, where they are placed, and which an idle GPU takes
for the jobs that wait (gpusched.core.mig_layout)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.mig_layout import (
    MODELS,
    LayoutError,
    MigDemand,
    MigGpu,
    best_placement,
    check_layout,
    fits,
    mig_gpus,
    placements,
    plan_layouts,
    waiting_demand,
)
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PendingJob,
    Reason,
    RunningJob,
)

A80 = "a100-80gb"
MIXED = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")


@pytest.mark.parametrize("layout", [
    (), ("7g.80gb",), ("4g.40gb", "3g.40gb"), ("3g.40gb", "3g.40gb"), MIXED,
    ("1g.10gb",) * 7, ("2g.20gb",) * 3 + ("1g.10gb",), ("1g.20gb",) * 4,
    ("4g.40gb", "2g.20gb", "1g.10gb"), ("3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"),
])
def test_layouts_real_a100s_take(layout: tuple[str, ...]) -> None:
    check_layout(A80, layout)
    option = best_placement(A80, layout)
    assert option is not None and Counter(p for p, _ in option) == Counter(layout)


@pytest.mark.parametrize(("layout", "message"), [
    (("3g.40gb", "4g.40gb", "1g.10gb"), "needs 8 compute slices; a100-80gb has 7"),
    (("1g.10gb",) * 8, "at most 7 instances"),
    (("3g.40gb",) * 3, "takes at most 2 x 3g.40gb"),
    (("1g.20gb",) * 4 + ("1g.10gb",), "cannot be placed on a100-80gb"),
    (("3g.40gb", "3g.40gb", "1g.10gb"), "cannot be placed"),
    (("1g.5gb",), "'1g.5gb' is not a MIG profile of a100-80gb (its profiles: 1g.10gb, 1g.20gb"),
    (("1g.10gb+me",), "not a MIG profile"),
])
def test_layouts_that_do_not_fit_say_why(layout: tuple[str, ...], message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("+", r"\+").replace("(", r"\(")):
        check_layout(A80, layout)
    assert not fits(A80, layout)


def test_unknown_models_and_malformed_layouts() -> None:
    with pytest.raises(LayoutError, match="'l4' cannot be re-partitioned"):
        check_layout("l4", ("1g.10gb",))
    with pytest.raises(LayoutError, match="list of MIG profile names"):
        check_layout(A80, "1g.10gb")
    assert fits("a100-40gb", ("1g.5gb",) * 7) and not fits("a100-40gb", ("1g.10gb",) * 5)


def test_placement_keeps_what_it_can() -> None:
    # 3g at 4 is the only way to add two more 1g slices beside a 2g at 0.
    assert best_placement(A80, MIXED) == (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2),
                                          ("1g.10gb", 3))
    kept = best_placement(A80, ("1g.10gb",) * 3, [("1g.10gb", 5), ("1g.10gb", 6), ("2g.20gb", 0)])
    assert kept is not None and {("1g.10gb", 5), ("1g.10gb", 6)} <= set(kept)
    assert best_placement(A80, ("7g.80gb", "1g.10gb")) is None
    assert len(list(placements(A80, ("1g.10gb",) * 7))) == 1


def gpu(uuid: str, layout: tuple[str, ...], in_use: tuple[str, ...] = (), **kw: object) -> MigGpu:
    return MigGpu(uuid, A80, layout, in_use, **kw)  # type: ignore[arg-type]


def test_a_waiting_1g_demand_repartitions_an_idle_gpu_keeping_what_is_useful() -> None:
    gpus = [gpu("GPU-a", ("7g.80gb",), ("7g.80gb",)), gpu("GPU-b", ("4g.40gb", "3g.40gb"))]
    demand = [MigDemand("1g.10gb", 1, 60.0), MigDemand("3g.40gb", 1, 10.0)]
    # The 3g stays (a job waits for it); the 4g is spare and gives way to 1g slices... and
    # only as many as wait.
    assert plan_layouts(gpus, demand, now=1000.0, min_interval=300.0) == {
        "GPU-b": ("3g.40gb", "1g.10gb")}


def test_spare_slices_that_still_fit_are_kept() -> None:
    gpus = [gpu("GPU-b", ("2g.20gb", "2g.20gb", "2g.20gb"))]
    got = plan_layouts(gpus, [MigDemand("1g.10gb", 1, 5.0)], now=0.0, min_interval=0.0)
    assert got == {"GPU-b": ("2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb")}


def test_free_slices_elsewhere_meet_the_demand_first() -> None:
    gpus = [gpu("GPU-a", MIXED, ("3g.40gb",)), gpu("GPU-b", ("7g.80gb",))]
    assert plan_layouts(gpus, [MigDemand("1g.10gb", 2, 600.0)], now=0.0, min_interval=0.0) == {}
    # A third 1g job: GPU-a is busy, so GPU-b changes.
    got = plan_layouts(gpus, [MigDemand("1g.10gb", 3, 600.0)], now=0.0, min_interval=0.0)
    assert got == {"GPU-b": ("1g.10gb",)}


def test_a_busy_gpu_is_never_changed() -> None:
    demand = [MigDemand("1g.10gb", 7, 9999.0)]
    assert plan_layouts([gpu("GPU-a", ("7g.80gb",), ("7g.80gb",))], demand, 0.0, 0.0) == {}
    assert plan_layouts([gpu("GPU-a", ("4g.40gb", "3g.40gb"), ("3g.40gb",))], demand, 0.0, 0.0) == {}
    assert plan_layouts([gpu("GPU-a", ("7g.80gb",), processes=True)], demand, 0.0, 0.0) == {}


def test_the_rate_limit_is_honoured() -> None:
    demand = [MigDemand("1g.10gb", 1, 100.0)]
    recent = [gpu("GPU-a", ("7g.80gb",), changed_at=800.0)]
    assert plan_layouts(recent, demand, now=1000.0, min_interval=300.0) == {}
    assert plan_layouts(recent, demand, now=1100.0, min_interval=300.0) == {"GPU-a": ("1g.10gb",)}
    # A GPU that may not change still lends its free slices to the demand.
    both = [*recent, gpu("GPU-b", ("3g.40gb", "3g.40gb"))]
    assert plan_layouts(both, [MigDemand("7g.80gb", 1, 50.0)], now=1000.0, min_interval=300.0) == {}


def test_min_wait_and_the_order_of_demand() -> None:
    gpus = [gpu("GPU-a", ())]
    demand = [MigDemand("4g.40gb", 1, 30.0), MigDemand("7g.80gb", 1, 90.0)]
    assert plan_layouts(gpus, demand, 0.0, 0.0) == {"GPU-a": ("7g.80gb",)}
    assert plan_layouts(gpus, demand, 0.0, 0.0, min_wait=60.0) == {"GPU-a": ("7g.80gb",)}
    assert plan_layouts(gpus, demand, 0.0, 0.0, min_wait=100.0) == {}
    # The longest-waiting demand first: the 4g waits longer now, and 3g slices fill the rest.
    demand = [MigDemand("4g.40gb", 1, 90.0), MigDemand("3g.40gb", 2, 30.0)]
    assert plan_layouts(gpus, demand, 0.0, 0.0) == {"GPU-a": ("4g.40gb", "3g.40gb")}


def test_unknown_models_and_profiles_are_left_alone() -> None:
    other = MigGpu("GPU-x", "b200", ("1g.23gb",))
    assert plan_layouts([other], [MigDemand("1g.23gb", 1, 10.0)], 0.0, 0.0) == {}
    assert plan_layouts([gpu("GPU-a", ())], [MigDemand("1g.5gb", 1, 10.0)], 0.0, 0.0) == {}


def test_deterministic_whatever_the_input_order() -> None:
    gpus = [gpu(f"GPU-{c}", ("7g.80gb",)) for c in "dcab"]
    demand = [MigDemand("2g.20gb", 4, 40.0), MigDemand("1g.10gb", 2, 40.0)]
    first = plan_layouts(gpus, demand, 0.0, 0.0)
    assert first == plan_layouts(list(reversed(gpus)), list(reversed(demand)), 0.0, 0.0)
    assert first == {"GPU-a": ("2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"),
                     "GPU-b": ("2g.20gb", "1g.10gb")}


PROFILES = sorted(MODELS[A80])
layouts = st.lists(st.sampled_from(PROFILES), max_size=7).map(tuple).filter(lambda t: fits(A80, t))


@st.composite
def node(draw: st.DrawFn) -> tuple[list[MigGpu], list[MigDemand], float]:
    gpus = []
    for i in range(draw(st.integers(1, 4))):
        layout = draw(layouts)
        in_use = tuple(p for p in layout if draw(st.booleans()) and draw(st.booleans()))
        gpus.append(MigGpu(f"GPU-{i}", draw(st.sampled_from([A80, A80, "h100-80gb", "l4"])), layout,
                           in_use, draw(st.booleans()) and draw(st.booleans()),
                           draw(st.none() | st.floats(0, 2000))))
    demand = [MigDemand(p, draw(st.integers(0, 8)), draw(st.floats(0, 5000)))
              for p in draw(st.lists(st.sampled_from([*PROFILES, "1g.5gb"]), max_size=5))]
    return gpus, demand, draw(st.floats(0, 3000))


@settings(max_examples=300, deadline=None)
@given(node())
def test_plans_are_valid_and_touch_only_idle_gpus_past_their_interval(
        case: tuple[list[MigGpu], list[MigDemand], float]) -> None:
    gpus, demand, now = case
    plan = plan_layouts(gpus, demand, now, min_interval=600.0)
    by_uuid = {g.uuid: g for g in gpus}
    for uuid, target in plan.items():
        g = by_uuid[uuid]
        check_layout(g.model, target)  # never an invalid layout
        assert not g.busy and not g.in_use and not g.processes  # never a busy GPU
        assert g.changed_at is None or now - g.changed_at >= 600.0
        assert Counter(target) != Counter(g.layout)
        # Only for waiting demand: every change adds a profile that jobs wait for.
        assert set(Counter(target) - Counter(g.layout)) <= {d.profile for d in demand if d.slices}
    assert plan == plan_layouts(list(reversed(gpus)), demand, now, min_interval=600.0)


def test_snapshot_to_planner_input() -> None:
    def mig(uuid: str, index: int, parent: int, profile: str, healthy: bool = True) -> GpuView:
        return GpuView(uuid, index, healthy, A80, profile, parent)

    node = NodeView("n1", NodeState.UP, (
        GpuView("GPU-0", 0, gpu_type=A80, mig_mode=True),
        mig("MIG-0a", 100, 0, "3g.40gb"), mig("MIG-0b", 101, 0, "1g.10gb"),
        GpuView("GPU-1", 1, gpu_type=A80, mig_mode=True),
        mig("MIG-1a", 200, 1, "7g.80gb"),
        GpuView("GPU-2", 2, gpu_type=A80, mig_mode=True),
        mig("MIG-2a", 300, 2, "7g.80gb", healthy=False),
        GpuView("GPU-3", 3, gpu_type=A80),
    ))
    running = [RunningJob(1, "n1", ("MIG-0b",)), RunningJob(2, "n9", ("MIG-1a",)),
               RunningJob(3, "n1", (), shares=(("MIG-0a", 50, 0),))]
    got = mig_gpus(node, running, changed_at={"GPU-1": 12.0}, processes={"MIG-1a"})
    assert got == [MigGpu("GPU-0", A80, ("3g.40gb", "1g.10gb"), ("3g.40gb", "1g.10gb"), False, None),
                   MigGpu("GPU-1", A80, ("7g.80gb",), (), True, 12.0)]

    def job(job_id: int, kinds: tuple[str, ...], gpus: int = 1, **kw: object) -> PendingJob:
        return PendingJob(job_id, "p", gpus, 1000, 100.0 + job_id, gpu_kinds=kinds, **kw)  # type: ignore[arg-type]

    jobs = [job(1, ("1g.10gb",)), job(2, ("1g.10gb",), 2, reason=Reason.RESOURCES),
            job(3, ("3g.40gb",), begin_time=500.0), job(4, ("3g.40gb",), hold="user"),
            job(5, ("3g.40gb",), reason=Reason.DEPENDENCY), job(6, ("a100-80gb",)),
            job(7, ("1g.10gb", "2g.20gb")), job(8, ("2g.20gb",), reason=Reason.PRIORITY)]
    assert waiting_demand(jobs, now=400.0) == [MigDemand("1g.10gb", 3, 299.0),
                                               MigDemand("2g.20gb", 1, 292.0)]
