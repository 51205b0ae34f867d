"""The GPU device fence without root: its rules, the v2 device program (assembled and
interpreted here; loaded by the kernel in tests/integration/test_gpu_fence_kernel.py), the v1
deny lines against an emulated cgroupfs, the GPU backends' device descriptions, gpu.fence's
modes, and a prepare refused (and cleaned up) when the fence cannot be had."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from noded.cgroups import GroupLimits, V1CgroupManager, detect_cgroups
from noded.cgroups.bpfdev import DEVCG_DEV_CHAR, assemble, run
from noded.cgroups.devrules import DeviceRules, job_rules, v1_deny_lines
from noded.gpu.devices import DeviceNode, GpuDeviceNodes
from noded.gpu.emudevices import make_device_files
from noded.gpu.emulated import DEV_DIR_ENV, EmulatedGpuBackend, EmulatedGpuConfig
from noded.gpu.nvdevices import char_majors, driver_libraries, nvidia_device_nodes
from noded.gpu.nvml import NvmlGpuBackend
from noded.gpufence import GpuFence, GpuFenceError
from noded.jobs import JobRefused, JobRunner
from shared.messages import PrepareJob
from shared.model import JobKind, JobSpec, NodeAllocation
from tests.unit.cgroups_tree import EmulatedCgroupFs
from tests.unit.fake_pynvml import FakeNvml

UVM = 508
NODES = GpuDeviceNodes(
    gpus={i: DeviceNode(f"/dev/nvidia{i}", 195, i) for i in range(4)},
    control=(DeviceNode("/dev/nvidiactl", 195, 255), DeviceNode("/dev/nvidia-uvm", UVM, 0),
             DeviceNode("/dev/nvidia-uvm-tools", UVM, 1)),
)
READ, WRITE, MKNOD = 2 << 16, 4 << 16, 1 << 16

# -- rules --------------------------------------------------------------------------------------


def test_a_job_may_open_its_gpus_and_the_control_files_only() -> None:
    rules = job_rules(NODES, (2,))
    assert rules.fenced_majors == (195, UVM)
    assert rules.allowed == ((195, 2), (195, 255), (UVM, 0), (UVM, 1))
    assert rules.denied == ((195, 0), (195, 1), (195, 3))
    assert rules.permits(195, 2) and not rules.permits(195, 3)
    assert not rules.permits(195, 254)  # a minor nobody described: refused too
    assert rules.permits(1, 3)  # /dev/null: not the fence's business
    assert v1_deny_lines(rules) == ["c 195:0 rw", "c 195:1 rw", "c 195:3 rw"]


def test_a_job_without_gpus_can_open_none() -> None:
    rules = job_rules(NODES, ())
    assert rules.allowed == () and not rules.permits(195, 255) and not rules.permits(UVM, 0)
    # whole majors: nothing of NVIDIA's, whatever minor
    assert v1_deny_lines(rules) == ["c 195:* rw", f"c {UVM}:* rw"]


def test_a_gpu_without_a_device_file_cannot_be_fenced_for() -> None:
    with pytest.raises(KeyError, match="no device file known for GPU 7"):
        job_rules(NODES, (7,))


@pytest.mark.parametrize("bad", [
    {"fenced_majors": (4096,), "allowed": (), "denied": ()},
    {"fenced_majors": (195,), "allowed": ((196, 0),), "denied": ()},
    {"fenced_majors": (195,), "allowed": ((195, 1),), "denied": ((195, 1),)},
    {"fenced_majors": (195,), "allowed": ((195, -1),), "denied": ()},
])
def test_rules_that_make_no_sense_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        DeviceRules(**bad)


# -- the v2 device program --------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [(), (0,), (1, 3), (0, 1, 2, 3)])
def test_the_device_program_decides_as_the_rules_do(gpus: tuple[int, ...]) -> None:
    rules = job_rules(NODES, gpus)
    program = assemble(rules)
    for major in (1, 195, UVM, 509):
        for minor in (0, 1, 2, 3, 254, 255):
            for access in (READ, WRITE, READ | WRITE):
                want = int(rules.permits(major, minor))
                assert run(program, access | DEVCG_DEV_CHAR, major, minor) == want, \
                    (gpus, major, minor, access)
            # mknod is left alone (see devrules), and so are block devices
            assert run(program, MKNOD | DEVCG_DEV_CHAR, major, minor) == 1
            assert run(program, READ | 1, major, minor) == 1


def test_an_empty_fence_is_an_allow_all_program_without_unreachable_code() -> None:
    program = assemble(DeviceRules((), (), ()))
    assert len(program) == 10 and run(program, READ | DEVCG_DEV_CHAR, 195, 0) == 1


# -- cgroup v1 against an emulated cgroupfs -----------------------------------------------------


def test_v1_fence_denies_other_gpus_in_the_jobs_devices_group(tmp_path: Path) -> None:
    ctls = ("cpuset", "devices")
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=ctls)
    m = V1CgroupManager("trellis-n1", {c: fs.base / c for c in ctls}, fs)
    assert m.fence_support() == ("devices", "")
    m.create("job-a", GroupLimits(cpus=(0,)))
    m.create("job-b", GroupLimits(cpus=(1,)))
    group = fs.base / "devices" / "trellis-n1" / "job-a"
    assert group / "cgroup.procs" in m.attach_files("job-a")  # the shim joins it
    m.fence_devices("job-a", job_rules(NODES, (1,)))
    m.fence_devices("job-a", job_rules(NODES, (1,)))  # again (re-adoption): same fence
    assert fs.device_denied[group].count(("c", "195", "0", "rw")) == 2
    for minor in (0, 2, 3):
        assert not fs.device_permitted(group, 195, minor)
    assert fs.device_permitted(group, 195, 1) and fs.device_permitted(group, 195, 255)
    assert fs.device_permitted(group, 195, 0, "m")  # mknod is not fenced
    # the other job's group is untouched, and the fence goes with the group
    assert fs.device_permitted(fs.base / "devices" / "trellis-n1" / "job-b", 195, 0)
    m.remove("job-a")
    assert not group.exists() and group not in fs.device_denied


def test_v1_without_a_devices_hierarchy_says_so(tmp_path: Path) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=("cpuset",))
    m = V1CgroupManager("trellis-n1", {"cpuset": fs.base / "cpuset"}, fs)
    assert m.fence_support() == ("none", "the cgroup v1 devices controller is not mounted")


# -- the backends' device files ----------------------------------------------------------------

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
195 nvidia
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
508 nvidia-uvm
"""
LDCONFIG = """1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /lib64/libnvidia-ptxjitcompiler.so.1
"""


def test_nvidia_device_files_come_from_minor_numbers_proc_devices_and_ldconfig() -> None:
    assert char_majors(PROC_DEVICES)["nvidia-uvm"] == 508
    nodes = nvidia_device_nodes({0: 3, 1: 0}, PROC_DEVICES, LDCONFIG, machine="x86_64")
    assert nodes.gpus == {0: DeviceNode("/dev/nvidia3", 195, 3), 1: DeviceNode("/dev/nvidia0",
                                                                                 195, 0)}
    assert [(n.path, n.major, n.minor) for n in nodes.control] == [
        ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 508, 0),
        ("/dev/nvidia-uvm-tools", 508, 1)]
    # the driver's own libraries for this ABI; the CUDA runtime belongs to the image
    assert nodes.libraries == ("/lib/x86_64-linux-gnu/libcuda.so.1",
                               "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                               "/lib64/libnvidia-ptxjitcompiler.so.1")
    # nvidia-uvm not loaded yet: only nvidiactl
    bare = nvidia_device_nodes({0: 0}, "Character devices:\n195 nvidia\n", "", machine="x86_64")
    assert [n.path for n in bare.control] == ["/dev/nvidiactl"] and bare.libraries == ()
    assert driver_libraries(LDCONFIG, machine="aarch64") == ()


def test_nvml_backend_describes_its_device_files(tmp_path: Path) -> None:
    nv = FakeNvml.standard(count=2)
    nv.devices[0].minor, nv.devices[1].minor = 1, 0  # minor numbers are not indices
    proc = tmp_path / "devices"
    proc.write_text(PROC_DEVICES)
    backend = NvmlGpuBackend(nvml=nv, proc_devices=proc, ldconfig=lambda: LDCONFIG)
    try:
        nodes = backend.device_nodes()
        assert {i: n.minor for i, n in nodes.gpus.items()} == {0: 1, 1: 0}
        assert len(nodes.control) == 3 and backend.device_nodes() is nodes  # read once
        assert job_rules(nodes, (0,)).denied == ((195, 0),)
    finally:
        backend.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="creating character devices needs CAP_MKNOD")
def test_emulated_gpus_get_character_devices_with_nvidias_numbers(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia1").write_text("left over")  # replaced by the right device
    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=2, dev_dir=str(dev),
                                                   progress_dir=str(tmp_path / "p")))
    try:
        nodes = backend.device_nodes()
        assert sorted(nodes.gpus) == [0, 1] and nodes.control[0].minor == 255
        for node in (*nodes.gpus.values(), *nodes.control):
            st = os.lstat(node.path)
            assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
            assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (node.major, node.minor)
        assert backend.job_env("job-a")[DEV_DIR_ENV] == str(dev)
    finally:
        backend.close()
    # made again by the next daemon, idempotently
    assert make_device_files(dev, 2) == nodes


def test_no_device_files_where_they_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert make_device_files(blocker / "dev", 2) == GpuDeviceNodes({})
    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=2, progress_dir=str(tmp_path / "p")))
    try:
        assert backend.device_nodes() == GpuDeviceNodes({})
        assert DEV_DIR_ENV not in backend.job_env("job-a")
    finally:
        backend.close()


# -- gpu.fence ----------------------------------------------------------------------------------


class FakeGroups:
    """A cgroup backend that records the fences it is given."""

    kind = "v1"

    def __init__(self, support: tuple[str, str], fail: Exception | None = None) -> None:
        self.support, self.fail = support, fail
        self.fenced: dict[str, DeviceRules] = {}
        self.removed: list[str] = []

    def fence_support(self) -> tuple[str, str]:
        return self.support

    def fence_devices(self, job_id: str, rules: DeviceRules) -> None:
        if self.fail is not None:
            raise self.fail
        self.fenced[job_id] = rules

    def create(self, job_id: str, limits: GroupLimits) -> None:
        pass

    def remove(self, job_id: str) -> None:
        self.removed.append(job_id)


class FakeGpus:
    name = "emulated"

    def __init__(self, nodes: GpuDeviceNodes = NODES) -> None:
        self.nodes = nodes

    def device_nodes(self) -> GpuDeviceNodes:
        return self.nodes


def test_auto_fences_where_the_cgroups_can(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trellis.node.gpufence")
    groups = FakeGroups(("devices", ""))
    fence = GpuFence("auto", groups, FakeGpus())  # type: ignore[arg-type]
    assert fence.kind == "devices" and "gpu_fence=devices cgroups=v1" in caplog.text
    fence.apply("job-a", (3,))
    assert groups.fenced["job-a"] == job_rules(NODES, (3,))


@pytest.mark.parametrize(("support", "nodes", "reason"), [
    (("none", "CPU affinity confines no devices"), NODES, "CPU affinity confines no devices"),
    (("devices", ""), GpuDeviceNodes({}), "the emulated GPU backend describes no device files"),
])
def test_auto_goes_without_and_says_why_where_it_cannot(
        support: tuple[str, str], nodes: GpuDeviceNodes, reason: str,
        caplog: pytest.LogCaptureFixture) -> None:
    groups = FakeGroups(support)
    fence = GpuFence("auto", groups, FakeGpus(nodes))  # type: ignore[arg-type]
    assert not fence.on and fence.reason == reason and "gpu_fence=off" in caplog.text
    fence.apply("job-a", (0,))
    assert groups.fenced == {}


def test_a_required_fence_that_cannot_be_had_stops_the_daemon() -> None:
    with pytest.raises(GpuFenceError, match="gpu.fence = 'bpf' cannot be had: this node's "
                                            r"cgroups \(v1\) fence with devices"):
        GpuFence("bpf", FakeGroups(("devices", "")), FakeGpus())  # type: ignore[arg-type]
    with pytest.raises(GpuFenceError, match="not mounted"):
        GpuFence("devices", FakeGroups(("none", "not mounted")), FakeGpus())  # type: ignore[arg-type]
    off = GpuFence("off", FakeGroups(("devices", "")), FakeGpus())  # type: ignore[arg-type]
    assert not off.on


def test_a_prepare_whose_fence_fails_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cgroups = detect_cgroups("trellis-test-fence", prefer="affinity",
                             state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=2, progress_dir=str(tmp_path / "p")))
    user = "root" if os.geteuid() == 0 else __import__("getpass").getuser()
    runner = JobRunner("n1", state, cgroups, gpus, allow_root_jobs=True, numa_of={0: 0})
    broken = FakeGroups(("devices", ""), OSError(1, "Operation not permitted"))
    runner.gpu_fence = GpuFence("devices", broken, FakeGpus())  # type: ignore[arg-type]
    spec = JobSpec(name="t", command=("true",), user=user, kind=JobKind.TRAINING, gpus=1, cpus=1)
    try:
        with pytest.raises(JobRefused) as refused:
            runner.prepare(PrepareJob(job_id="job-f", spec=spec, grace_s=1.0,
                                      allocation=NodeAllocation(node="n1", gpus=(1,),
                                                                cpus=(0,))))
        assert refused.value.code == "gpu_fence_failed"
        assert "cannot fence job job-f from the GPUs it was not given on n1" in str(refused.value)
        assert cgroups.list_jobs() == [] and not (state / "jobs" / "job-f").exists()
        assert "job-f" not in runner.parts
    finally:
        gpus.close()


def test_a_prepared_part_is_fenced_and_fenced_again_when_re_adopted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cgroups = detect_cgroups("trellis-test-fence", prefer="affinity",
                             state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=4, progress_dir=str(tmp_path / "p")))
    user = "root" if os.geteuid() == 0 else __import__("getpass").getuser()
    runner = JobRunner("n1", state, cgroups, gpus, allow_root_jobs=True, numa_of={0: 0})
    recorder = FakeGroups(("devices", ""))
    runner.gpu_fence = GpuFence("auto", recorder, FakeGpus())  # type: ignore[arg-type]
    spec = JobSpec(name="t", command=("true",), user=user, kind=JobKind.TRAINING, gpus=2, cpus=1)
    try:
        runner.prepare(PrepareJob(job_id="job-r", spec=spec, grace_s=1.0,
                                  allocation=NodeAllocation(node="n1", gpus=(1, 3), cpus=(0,))))
        assert recorder.fenced["job-r"] == job_rules(NODES, (1, 3))
        del recorder.fenced["job-r"]
        runner._repin(runner.parts["job-r"])  # what adopt() does for a part still running
        assert recorder.fenced["job-r"] == job_rules(NODES, (1, 3))
    finally:
        runner.stop("job-r", 0.0, "test over")
        gpus.close()
