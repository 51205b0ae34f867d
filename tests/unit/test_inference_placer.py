"""The hardware-aware inference placer (masterd.core.inference) driven like masterd would."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from masterd.core.cluster import ClusterState
from masterd.core.inference import (
    InferencePlacer,
    InferenceProfile,
    LaunchReplica,
    PlacerConfig,
    PlacerError,
    ReplicaAction,
    ReplicaKind,
    ReplicaRoom,
    RetireReplica,
    UnknownServiceError,
    load_from_qps,
    replica_room,
)
from masterd.core.policy import Preempt
from shared.model import (
    CpuCore,
    GpuInfo,
    Job,
    JobKind,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeInventory,
    Placement,
)

BS_GPU = 32
CPU_BATCH = 8


def gpu_node(name: str, gpus: int = 4, cores: int = 32, model: str = "A100") -> NodeInventory:
    half = max(1, cores // 2)
    return NodeInventory(
        name=name, hostname=name, address=f"10.0.0.{abs(hash(name)) % 250 + 1}",
        gpus=tuple(
            GpuInfo(index=i, uuid=f"{name}-{i}", model=model, memory_mib=40960,
                    numa_node=0 if i < gpus // 2 else 1)
            for i in range(gpus)
        ),
        cpus=tuple(CpuCore(id=c, socket=c // half, numa_node=c // half) for c in range(cores)),
        memory_mib=512 * 1024,
    )


def cpu_node(name: str, cores: int = 64) -> NodeInventory:
    return NodeInventory(
        name=name, hostname=name, address="10.0.1.1",
        cpus=tuple(CpuCore(id=c) for c in range(cores)), memory_mib=256 * 1024,
    )


def profile(**kwargs: object) -> InferenceProfile:
    base: dict[str, object] = {
        "service": "resnet", "bs_gpu": BS_GPU, "cpu_batch": CPU_BATCH, "cpu_cores": 8,
        "cpu_mbw_gbps": 10.0,
    }
    base.update(kwargs)
    return InferenceProfile(**base)  # type: ignore[arg-type]


@dataclass
class Driver:
    """Plays masterd: carries out the placer's actions on a real ClusterState."""

    placer: InferencePlacer
    nodes: Sequence[NodeInventory]
    headroom: dict[str, float] = field(default_factory=dict)
    state: ClusterState = field(default_factory=ClusterState)
    running: dict[str, Job] = field(default_factory=dict)
    log: list[tuple[float, ReplicaAction]] = field(default_factory=list)
    apply_preemptions: bool = True

    def __post_init__(self) -> None:
        for node in self.nodes:
            self.state.upsert_node(node)
        if not self.headroom:
            self.headroom = {n.name: 60.0 for n in self.nodes}

    def add_job(self, job_id: str, kind: JobKind, submitted: float, node: str,
                gpus: tuple[int, ...] = (), cpus: tuple[int, ...] = ()) -> None:
        spec = JobSpec(name=job_id, command=("run",), user="alice", kind=kind,
                       gpus=len(gpus), cpus=len(cpus) or 1)
        placement = Placement((NodeAllocation(node, gpus, cpus),))
        self.state.allocate(job_id, placement)
        self.running[job_id] = Job(job_id, spec, submitted, JobState.RUNNING, placement)

    def step(self, now: float, headroom: Mapping[str, float] | None = None
             ) -> list[ReplicaAction]:
        snapshot = self.state.snapshot(dict(self.running))
        actions = self.placer.plan(snapshot, now, headroom or self.headroom)
        for action in actions:
            if isinstance(action, LaunchReplica):
                self.state.allocate(action.replica.id, action.replica.placement)
            elif isinstance(action, RetireReplica):
                self.state.release(action.replica.id)
            elif isinstance(action, Preempt) and self.apply_preemptions:
                self.state.release(action.job_id)
                del self.running[action.job_id]
            self.log.append((now, action))
        return actions

    def drive(self, service: str, loads: Sequence[tuple[float, float]]) -> None:
        """Report each (time, load) and plan right after it."""
        for now, load in loads:
            self.placer.report_load(service, load, now)
            self.step(now)

    def kinds(self, service: str) -> list[ReplicaKind]:
        return sorted(r.kind for r in self.placer.replicas(service))


def launches(actions: Sequence[ReplicaAction]) -> list[LaunchReplica]:
    return [a for a in actions if isinstance(a, LaunchReplica)]


def retires(actions: Sequence[ReplicaAction]) -> list[RetireReplica]:
    return [a for a in actions if isinstance(a, RetireReplica)]


def hold(load: float, start: float, end: float, every: float = 5.0) -> list[tuple[float, float]]:
    t, out = start, []
    while t <= end:
        out.append((t, load))
        t += every
    return out


@pytest.fixture
def placer() -> InferencePlacer:
    placer = InferencePlacer(PlacerConfig(sustain_s=30.0))
    placer.register(profile())
    return placer


# -- CPU at low load, GPU at high load ------------------------------------------------------------


def test_low_load_is_served_from_cpu_cores_of_gpu_nodes(placer: InferencePlacer) -> None:
    driver = Driver(placer, [cpu_node("c1"), gpu_node("g1")])
    placer.report_load("resnet", 5.0, 0.0)
    actions = driver.step(0.0)
    (launch,) = launches(actions)
    assert launch.replica.kind is ReplicaKind.CPU
    assert launch.replica.node == "g1"  # never the CPU-only node
    assert launch.replica.gpu is None and len(launch.replica.cpus) == 8
    endpoints = placer.place("resnet")
    assert endpoints.mode is ReplicaKind.CPU
    assert [e.node for e in endpoints.endpoints] == ["g1"]


def test_switches_to_gpu_once_load_stays_above_bs_gpu(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")])
    driver.drive("resnet", hold(30.0, 0.0, 100.0))  # 30 < bs_gpu: five CPU replicas (cap 40)
    assert driver.kinds("resnet") == [ReplicaKind.CPU] * 5
    driver.drive("resnet", hold(36.0, 105.0, 130.0))  # above bs_gpu, not yet for 30 s
    assert ReplicaKind.GPU not in driver.kinds("resnet")
    placer.report_load("resnet", 36.0, 135.0)
    actions = driver.step(135.0)
    # Make before break: the GPU replicas are launched first, then every CPU replica retires.
    kinds = [(type(a).__name__, a.replica.kind) for a in actions
             if isinstance(a, LaunchReplica | RetireReplica)]
    assert kinds == [("LaunchReplica", ReplicaKind.GPU)] * 2 + \
        [("RetireReplica", ReplicaKind.CPU)] * 5
    assert placer.place("resnet").mode is ReplicaKind.GPU
    assert all(r.gpu is not None for r in placer.replicas("resnet"))


def test_switches_at_once_when_load_exceeds_what_cpu_replicas_carry(
    placer: InferencePlacer,
) -> None:
    driver = Driver(placer, [gpu_node("g1")])
    driver.drive("resnet", [(0.0, 4.0)])
    assert driver.kinds("resnet") == [ReplicaKind.CPU]
    driver.drive("resnet", [(5.0, 50.0)])  # one CPU replica carries 8: no time to wait
    assert driver.kinds("resnet") == [ReplicaKind.GPU] * 2


def test_back_to_cpu_only_below_the_hysteresis_band(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")])
    driver.drive("resnet", [(0.0, 40.0)])
    assert driver.kinds("resnet") == [ReplicaKind.GPU] * 2
    # 28 is below bs_gpu but above 0.75 * 32 = 24: stay on the GPUs however long it lasts.
    driver.drive("resnet", hold(28.0, 5.0, 600.0))
    assert set(driver.kinds("resnet")) == {ReplicaKind.GPU}
    driver.drive("resnet", hold(20.0, 605.0, 630.0))  # below the band, not yet for 30 s
    assert set(driver.kinds("resnet")) == {ReplicaKind.GPU}
    driver.drive("resnet", [(635.0, 20.0)])
    assert driver.kinds("resnet") == [ReplicaKind.CPU] * 4  # ceil(20 / (0.8 * 8))
    assert placer.place("resnet").mode is ReplicaKind.CPU


@pytest.mark.parametrize(("swing", "half_period"), [(3.0, 5.0), (3.0, 20.0), (4.0, 60.0)])
def test_load_oscillating_around_bs_gpu_does_not_flap(
    placer: InferencePlacer, swing: float, half_period: float
) -> None:
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")])
    driver.drive("resnet", hold(BS_GPU - swing, 0.0, 60.0))
    loads, t, high = [], 65.0, True
    while t < 3600.0:
        loads += hold(BS_GPU + swing if high else BS_GPU - swing, t, t + half_period - 5.0)
        t += half_period
        high = not high
    versions_before = placer.place("resnet").version
    driver.drive("resnet", loads)
    modes = [a.replica.kind for _, a in driver.log if isinstance(a, LaunchReplica)]
    switches = sum(1 for a, b in itertools.pairwise(modes) if a != b)
    assert switches <= 1
    if half_period > 30.0:
        # Above bs_gpu for longer than sustain_s: one switch to GPU, and it stays there.
        assert placer.place("resnet").mode is ReplicaKind.GPU and switches == 1
    else:
        assert placer.place("resnet").mode is ReplicaKind.CPU and switches == 0
    # After settling, an hour of oscillation changes the replica set a bounded few times.
    assert placer.place("resnet").version - versions_before <= 8


# -- replica counts ---------------------------------------------------------------------------


def test_scale_out_when_load_stays_above_80_percent_of_capacity() -> None:
    placer = InferencePlacer(PlacerConfig(sustain_s=30.0))
    placer.register(profile(cpu_batch=0, cpu_cores=0))  # GPU only
    driver = Driver(placer, [gpu_node("g1")])
    driver.drive("resnet", hold(20.0, 0.0, 60.0))
    assert driver.kinds("resnet") == [ReplicaKind.GPU]
    driver.drive("resnet", hold(27.0, 65.0, 90.0))  # 27 > 0.8 * 32, for 25 s only
    assert len(placer.replicas("resnet")) == 1
    driver.drive("resnet", [(95.0, 27.0)])
    assert len(placer.replicas("resnet")) == 2
    driver.drive("resnet", hold(27.0, 100.0, 300.0))  # 27 < 0.8 * 64: no more
    assert len(placer.replicas("resnet")) == 2


def test_load_over_capacity_launches_at_once() -> None:
    placer = InferencePlacer(PlacerConfig(sustain_s=30.0))
    placer.register(profile(cpu_batch=0, cpu_cores=0))
    driver = Driver(placer, [gpu_node("g1")])
    driver.drive("resnet", [(0.0, 10.0), (5.0, 70.0)])
    assert len(placer.replicas("resnet")) == 3  # ceil(70 / 25.6)


def test_scale_in_when_load_falls_but_never_below_one(placer: InferencePlacer) -> None:
    placer.register(profile(cpu_batch=0, cpu_cores=0))  # re-register: GPU only now
    driver = Driver(placer, [gpu_node("g1")])
    driver.drive("resnet", [(0.0, 60.0)])
    assert len(placer.replicas("resnet")) == 3
    driver.drive("resnet", hold(30.0, 5.0, 40.0))  # 30 < 0.6 * 64 for 35 s: retire one
    assert len(placer.replicas("resnet")) == 2
    driver.drive("resnet", hold(30.0, 45.0, 300.0))  # 30 > 0.6 * 32: keep two
    assert len(placer.replicas("resnet")) == 2
    driver.drive("resnet", hold(0.0, 305.0, 600.0))
    assert len(placer.replicas("resnet")) == 1


# -- memory bandwidth -------------------------------------------------------------------------


def test_cpu_replicas_only_where_bandwidth_headroom_allows(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2"), gpu_node("g3")],
                    headroom={"g1": 5.0, "g2": 25.0})  # g3 unknown: no headroom
    driver.drive("resnet", [(0.0, 10.0)])  # two CPU replicas, 10 GB/s each
    assert [r.node for r in placer.replicas("resnet")] == ["g2", "g2"]
    # A third would need 30 GB/s on g2: the service moves to a GPU instead.
    driver.drive("resnet", hold(18.0, 5.0, 40.0))
    assert driver.kinds("resnet") == [ReplicaKind.GPU]


def test_cpu_replicas_only_on_the_cores_they_are_given(placer: InferencePlacer) -> None:
    # Under SODA's arrays a CPU replica is a CPU job: the master passes the CPU-job array.
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")])
    snapshot = driver.state.snapshot({})
    placer.report_load("resnet", 5.0, 0.0)
    (launch,) = launches(placer.plan(snapshot, 0.0, driver.headroom,
                                     ReplicaRoom(cpu={"g1": range(4), "g2": range(24, 32)})))
    assert launch.replica.node == "g2" and set(launch.replica.cpus) <= set(range(24, 32))
    # With no CPU-job cores big enough anywhere, the service is served from a GPU.
    other = InferencePlacer(PlacerConfig(sustain_s=30.0))
    other.register(profile())
    other.report_load("resnet", 5.0, 0.0)
    (launch,) = launches(other.plan(snapshot, 0.0, driver.headroom,
                                    ReplicaRoom(cpu={"g1": range(4)})))
    assert launch.replica.kind is ReplicaKind.GPU


def test_gpu_replicas_only_on_the_nodes_and_cores_they_are_given() -> None:
    # Under SODA's arrays a GPU replica is a one-GPU job: the small-job array's nodes and
    # their GPU-job cores, never a loan of the large array or cores of the CPU-job array.
    room = ReplicaRoom(cpu={}, gpu={"g2": range(0, 4)})
    for gpu_replica_cpus in (2, 0):
        placer = InferencePlacer()
        placer.register(profile(service="bert", cpu_batch=0, cpu_cores=0,
                                gpu_replica_cpus=gpu_replica_cpus))
        driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")])
        driver.add_job("busy", JobKind.TRAINING, 1.0, "g2", gpus=(0, 1), cpus=(0,))
        placer.report_load("bert", 10.0, 0.0)
        (launch,) = launches(placer.plan(driver.state.snapshot(dict(driver.running)), 0.0,
                                         driver.headroom, room))
        # g1 is idle, g2 half busy: g2 all the same, on its allowed cores.
        assert launch.replica.node == "g2" and launch.replica.gpu in (2, 3)
        assert set(launch.replica.cpus) <= {1, 2, 3}
        assert len(launch.replica.cpus) == gpu_replica_cpus
    # Nowhere to go: no replica, and no preemption of a job off the allowed nodes.
    placer = InferencePlacer()
    placer.register(profile(service="bert", cpu_batch=0, cpu_cores=0))
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")])
    # fill-g1 is the more recent: it would be the victim were g1 allowed.
    for node, submitted in (("g1", 2.0), ("g2", 1.0)):
        driver.add_job(f"fill-{node}", JobKind.TRAINING, submitted, node, gpus=(0, 1, 2, 3))
    placer.report_load("bert", 10.0, 0.0)
    actions = placer.plan(driver.state.snapshot(dict(driver.running)), 0.0, driver.headroom,
                          ReplicaRoom(cpu={}, gpu={"g2": range(2)}))
    assert [a.job_id for a in actions if isinstance(a, Preempt)] == ["fill-g2"]


def test_replica_room_follows_soda_arrays() -> None:
    from masterd.core.policies import make_policy, soda_arrays

    nodes = [gpu_node("g1", cores=16), gpu_node("g2", cores=16)]
    state = ClusterState()
    for node in nodes:
        state.upsert_node(node)
    snapshot = state.snapshot({})
    assert replica_room(make_policy("fifo"), snapshot) == ReplicaRoom()
    policy = soda_arrays(models={"*": {"large": 4, "cpu_job_cores": 4}})
    room = replica_room(policy, snapshot)
    amap = policy.array_map(snapshot)
    small = [n for n, na in amap.nodes.items() if na.gpu_array.kind == "small"]
    assert room.gpu is not None and room.cpu is not None
    assert sorted(room.gpu) == small and len(small) == 1
    for node in small:
        assert set(room.gpu[node]) == amap.nodes[node].gpu_job_cpus
        assert not set(room.gpu[node]) & set(room.cpu[node])
    assert all(len(cores) == 4 for cores in room.cpu.values())


def test_gpu_to_cpu_switch_waits_for_bandwidth(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1")], headroom={"g1": 1.0})
    driver.drive("resnet", [(0.0, 40.0)])
    assert set(driver.kinds("resnet")) == {ReplicaKind.GPU}
    driver.drive("resnet", hold(5.0, 5.0, 120.0))  # low load, but no bandwidth for CPU
    assert set(driver.kinds("resnet")) == {ReplicaKind.GPU}
    placer.report_load("resnet", 5.0, 125.0)
    driver.step(125.0, {"g1": 30.0})
    assert driver.kinds("resnet") == [ReplicaKind.CPU]


# -- GPU choice and preemption ----------------------------------------------------------------


def test_gpu_replicas_go_to_the_most_idle_gpu_model() -> None:
    placer = InferencePlacer()
    placer.register(profile(service="bert", cpu_batch=0, cpu_cores=0))
    driver = Driver(placer, [gpu_node("a1", model="A100"), gpu_node("v1", model="V100")])
    driver.add_job("busy", JobKind.TRAINING, 1.0, "v1", gpus=(0, 1, 2))
    driver.drive("bert", [(0.0, 10.0)])
    assert [r.node for r in placer.replicas("bert")] == ["a1"]
    placer.register(profile(service="pinned", cpu_batch=0, cpu_cores=0, gpu_model="V100"))
    driver.drive("pinned", [(5.0, 10.0)])
    (replica,) = placer.replicas("pinned")
    assert replica.node == "v1" and replica.gpu == 3


def test_preempts_the_most_recently_submitted_job_that_makes_room() -> None:
    placer = InferencePlacer()
    placer.register(profile(service="bert", cpu_batch=0, cpu_cores=0))
    driver = Driver(placer, [gpu_node("g1"), cpu_node("c1")], apply_preemptions=False)
    driver.add_job("t-old", JobKind.TRAINING, 100.0, "g1", gpus=(0, 1))
    driver.add_job("t-new", JobKind.TRAINING, 300.0, "g1", gpus=(2,))
    driver.add_job("t-mid", JobKind.TRAINING, 200.0, "g1", gpus=(3,))
    driver.add_job("cpu-newest", JobKind.CPU, 400.0, "c1", cpus=(0, 1))  # frees no GPU
    placer.report_load("bert", 10.0, 500.0)
    actions = driver.step(500.0)
    assert actions == [Preempt("t-new", "inference service bert needs resources")]
    assert driver.step(505.0) == []  # one pending preemption at a time
    # The victim exits: its GPU is free and the replica goes there.
    driver.state.release("t-new")
    del driver.running["t-new"]
    (launch,) = launches(driver.step(510.0))
    assert (launch.replica.node, launch.replica.gpu) == ("g1", 2)


def test_cpu_job_can_be_the_victim_for_a_cpu_replica() -> None:
    placer = InferencePlacer()
    placer.register(profile())
    driver = Driver(placer, [gpu_node("g1", gpus=1, cores=16)], apply_preemptions=False)
    driver.add_job("train", JobKind.TRAINING, 10.0, "g1", gpus=(0,), cpus=(0, 1, 2, 3))
    driver.add_job("etl", JobKind.CPU, 20.0, "g1", cpus=tuple(range(4, 16)))
    placer.report_load("resnet", 4.0, 30.0)
    assert driver.step(30.0) == [Preempt("etl", "inference service resnet needs resources")]


def test_inference_jobs_are_never_preempted() -> None:
    placer = InferencePlacer()
    placer.register(profile(service="bert", cpu_batch=0, cpu_cores=0))
    driver = Driver(placer, [gpu_node("g1", gpus=1)])
    driver.add_job("other-inference", JobKind.INFERENCE, 100.0, "g1", gpus=(0,))
    placer.report_load("bert", 10.0, 200.0)
    assert driver.step(200.0) == []


# -- endpoints and versions -------------------------------------------------------------------


def test_version_changes_exactly_when_the_replica_set_changes(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1")])
    assert placer.place("resnet").version == 0
    driver.drive("resnet", [(0.0, 5.0)])
    first = placer.place("resnet")
    assert first.version == 1 and len(first.endpoints) == 1
    driver.drive("resnet", hold(5.0, 5.0, 300.0))
    assert placer.place("resnet") == first  # nothing changed: clients keep their cache
    (replica,) = placer.replicas("resnet")
    placer.replica_lost("resnet", replica.id)
    driver.state.release(replica.id)
    assert placer.place("resnet").version == 2
    driver.drive("resnet", [(305.0, 5.0)])  # replaced
    after = placer.place("resnet")
    assert after.version == 3 and after.endpoints[0].replica_id != replica.id


def test_deregister_retires_every_replica(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1")])
    driver.drive("resnet", [(0.0, 12.0)])
    ids = {r.id for r in placer.replicas("resnet")}
    retired = placer.deregister("resnet")
    assert {r.replica.id for r in retired} == ids and len(ids) == 2
    assert placer.services == []
    with pytest.raises(UnknownServiceError):
        placer.place("resnet")


def test_replicas_on_a_vanished_node_are_forgotten(placer: InferencePlacer) -> None:
    driver = Driver(placer, [gpu_node("g1"), gpu_node("g2")], headroom={"g1": 60.0})
    driver.drive("resnet", [(0.0, 5.0)])
    assert [r.node for r in placer.replicas("resnet")] == ["g1"]
    version = placer.place("resnet").version
    driver.state.remove_node("g1")
    driver.drive("resnet", [(5.0, 5.0)])
    # g2 has no bandwidth headroom for a CPU replica, so the replacement is a GPU there.
    (replica,) = placer.replicas("resnet")
    assert (replica.node, replica.kind) == ("g2", ReplicaKind.GPU)
    assert placer.place("resnet").version == version + 2  # one forgotten, one launched


# -- bad input --------------------------------------------------------------------------------


def test_unknown_service_is_a_value_error(placer: InferencePlacer) -> None:
    for call in (
        lambda: placer.report_load("nope", 1.0, 0.0),
        lambda: placer.place("nope"),
        lambda: placer.deregister("nope"),
        lambda: placer.replica_lost("nope", "x"),
    ):
        with pytest.raises(UnknownServiceError, match="'nope' is not registered"):
            call()
    assert issubclass(UnknownServiceError, ValueError)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "3", True])
def test_bad_load_is_rejected(placer: InferencePlacer, bad: object) -> None:
    with pytest.raises(PlacerError, match="load"):
        placer.report_load("resnet", bad, 0.0)  # type: ignore[arg-type]


def test_load_reports_cannot_go_back_in_time(placer: InferencePlacer) -> None:
    placer.report_load("resnet", 1.0, 10.0)
    with pytest.raises(PlacerError, match="older"):
        placer.report_load("resnet", 1.0, 9.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bs_gpu": 0}, "bs_gpu"),
        ({"cpu_batch": -1}, "cpu_batch"),
        ({"cpu_cores": 0}, "cpu_cores"),
        ({"cpu_mbw_gbps": -2.0}, "cpu_mbw_gbps"),
        ({"window_ms": 300.0}, "window_ms"),
        ({"qos_ms": 0.0}, "qos_ms"),
        ({"service": "../etc"}, "not a valid name"),
        ({"service": "s" * 41}, "longer than"),
    ],
)
def test_bad_profile_is_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        profile(**kwargs)


def test_bad_config_is_rejected() -> None:
    with pytest.raises(PlacerError, match="scale_in_fraction"):
        PlacerConfig(scale_in_fraction=0.9)
    with pytest.raises(PlacerError, match="gpu_down_fraction"):
        PlacerConfig(gpu_down_fraction=1.0)


def test_qps_converts_to_queries_per_window() -> None:
    assert load_from_qps(250.0, profile(window_ms=80.0)) == pytest.approx(20.0)
