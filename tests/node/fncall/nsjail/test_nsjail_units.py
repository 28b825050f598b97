"""Pure unit tests of the nsjail backend's pieces (no jail is started)."""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from node.fncall import registry
from node.fncall.nsjail import NsjailBackend, NsjailConfig
from node.fncall.nsjail.cgroups import CgroupMode, CgroupSetup
from node.fncall.nsjail.command import CGROUP_WRAPPER, JailCommand
from node.fncall.nsjail.languages import BUILTIN, StagePlan, plan
from node.fncall.nsjail.request import check, output_cap, zygote_memory_mb
from node.fncall.nsjail.results import classify, stage_cpu_ms
from node.fncall.nsjail.seccomp import allowed, denied, kafel_policy
from node.fncall.nsjail.sharedfs import SharedDir
from node.settings import NodeSettings
from node.workfiles import InvalidSpec
from wire.execution import RunLimits, RunSpec, StageStatus

REQUIRED_DENIED = {
    "ptrace", "mount", "umount2", "kexec_load", "kexec_file_load", "bpf", "perf_event_open",
    "keyctl", "add_key", "request_key", "userfaultfd", "init_module", "finit_module",
    "delete_module", "pivot_root", "swapon", "swapoff", "reboot", "setns", "unshare",
}  # fmt: skip


def test_seccomp_policy_is_an_allow_list() -> None:
    policy = kafel_policy()
    assert set(denied()) >= REQUIRED_DENIED
    assert not set(denied()) & set(allowed())
    assert not REQUIRED_DENIED & set(allowed())
    # anything not allowed, x32 numbers included, falls to the default
    assert policy.endswith("DEFAULT ERRNO(1)") and "SYSCALL[" not in policy
    assert "ERRNO(38) { clone3 }" in policy
    assert "socket { family != 1 && family != 2 && family != 10 }" in policy
    assert "prlimit64 { pid != 0 }" in policy


def _command(tmp_path: Path, **config: Any) -> list[str]:
    cmd = JailCommand(
        nsjail=Path("/usr/bin/nsjail"),
        config=NsjailConfig(**config),
        cgroups=CgroupSetup(
            CgroupMode.V1,
            "CORRAL",
            memory=Path("/sys/fs/cgroup/memory"),
            pids=Path("/sys/fs/cgroup/pids"),
            cpu=Path("/sys/fs/cgroup/cpu"),
        ),
        shared=SharedDir(tmp_path, mounted=False),
        zygote="pass",
    )
    return cmd.argv(hostname="corral-x", initial_memory_bytes=1 << 28)


def test_command_maps_nobody_to_nobody_and_binds_nothing_private(tmp_path: Path) -> None:
    argv = _command(tmp_path)
    pairs = list(itertools.pairwise(argv))
    assert ("--user", "65534:65534") in pairs and ("--group", "65534:65534") in pairs
    assert all(not (flag in ("--user", "-u") and value == "65534") for flag, value in pairs)
    binds = [value for flag, value in pairs if flag in ("--bindmount_ro", "--bindmount")]
    assert not [v for v in argv if v.startswith("--bindmount") and v != "--bindmount_ro"]
    for forbidden in ("/etc/shadow", "/root", "/home", "/work", "/etc", "/", "/var", "/sys"):
        assert forbidden not in [b.split(":")[0] for b in binds]
    assert "--disable_clone_newnet" not in argv and "-N" not in argv
    assert "--keep_env" not in argv and "--keep_caps" not in argv
    # v1 groups are the host's: nsjail gets no cgroup flags, it is started inside them
    assert not [arg for arg in argv if arg.startswith("--cgroup")]
    assert argv[argv.index("--") + 1 :] == ["/usr/bin/python3", "-I", "-c", "pass"]
    # what the jail must not see is covered by the shared directory's empty file and dir
    assert (f"{tmp_path}/empty.d:/usr/local") in binds
    assert f"{tmp_path}/empty:/proc/cmdline" in binds
    assert ("--mount", "none:/proc:proc:ro") in pairs and "--disable_proc" in argv
    assert argv.index("none:/proc:proc:ro") < argv.index(f"{tmp_path}/empty:/proc/cmdline")


def test_command_starts_nsjail_inside_the_jail_cgroups(tmp_path: Path) -> None:
    cmd = JailCommand(
        nsjail=Path("/usr/bin/nsjail"),
        config=NsjailConfig(),
        cgroups=CgroupSetup(CgroupMode.V1, "CORRAL", memory=Path("/m"), pids=Path("/p")),
        shared=SharedDir(tmp_path, mounted=False),
        zygote="pass",
    )
    procs = [Path("/m/CORRAL/j/cgroup.procs"), Path("/p/CORRAL/j/cgroup.procs")]
    argv = cmd.argv(hostname="corral-j", initial_memory_bytes=1 << 28, join_cgroups=procs)
    assert argv[:4] == ["/bin/sh", "-c", CGROUP_WRAPPER, "corral-jail"]
    assert argv[4:7] == [*map(str, procs), "--"] and argv[7] == "/usr/bin/nsjail"


def test_cgroup_v1_flags_for_a_jail_whose_groups_nsjail_makes() -> None:
    setup = CgroupSetup(
        CgroupMode.V1, "CORRAL_WASM", memory=Path("/m"), pids=Path("/p"), cpu=Path("/c")
    )
    flags = setup.nsjail_flags(memory_bytes=100, pids=10, cpu_ms_per_sec=500)
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pairs["--cgroup_mem_max"] == "100" and pairs["--cgroup_mem_parent"] == "CORRAL_WASM"
    assert pairs["--cgroup_pids_max"] == "10" and pairs["--cgroup_cpu_ms_per_sec"] == "500"


def test_cgroup_v2_flags() -> None:
    setup = CgroupSetup(CgroupMode.V2, "CORRAL", root=Path("/sys/fs/cgroup"))
    flags = setup.nsjail_flags(memory_bytes=100, pids=10, cpu_ms_per_sec=500)
    assert "--use_cgroupv2" in flags and "--cgroup_mem_parent" not in flags
    assert (
        CgroupSetup(CgroupMode.OFF, "X").nsjail_flags(memory_bytes=1, pids=1, cpu_ms_per_sec=1)
        == []
    )


def _plan(name: str = "run", **kw: Any) -> StagePlan:
    base: dict[str, Any] = {
        "name": name, "argv": ("./main",), "timeout_s": 2.0, "memory_mb": 128,
        "address_space_bytes": 128 << 20, "nproc": 10, "max_file_bytes": 1 << 20,
        "nofile": 64, "stdin": True, "oom_markers": ("std::bad_alloc",),
    }  # fmt: skip
    base.update(kw)
    return StagePlan(**base)


def _report(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "run", "exit_code": 0, "signal": None, "stdout": "", "stderr": "",
        "timed_out": False, "cpu_exceeded": False, "cpu_ms": 10.0, "cpu_limit_s": 2,
        "maxrss_kb": 4096, "error": None, "start_failure": None,
    }  # fmt: skip
    base.update(kw)
    return base


OOM = "what(): std::bad_alloc"


@pytest.mark.parametrize(
    ("report", "oom", "status"),
    [
        (_report(), False, StageStatus.FINISHED),
        (_report(exit_code=3), False, StageStatus.FINISHED),
        (_report(exit_code=None, signal=9, timed_out=True), False, StageStatus.TIME_LIMIT),
        (_report(exit_code=None, signal=signal.SIGXCPU), False, StageStatus.TIME_LIMIT),
        (_report(exit_code=None, signal=9, cpu_ms=2500.0), False, StageStatus.TIME_LIMIT),
        (_report(exit_code=None, signal=9), True, StageStatus.MEMORY_LIMIT),
        # an out-of-memory message counts only with the memory really used (128 MB plan)
        (_report(exit_code=None, signal=6, stderr=OOM, maxrss_kb=100_000), False, "memory_limit"),
        (_report(exit_code=None, signal=6, stderr=OOM, maxrss_kb=20_000), False, "killed"),
        (_report(exit_code=1, stderr=OOM, maxrss_kb=20_000), False, StageStatus.FINISHED),
        (_report(exit_code=0, stderr=OOM, maxrss_kb=100_000), False, StageStatus.FINISHED),
        (_report(exit_code=None, signal=signal.SIGXFSZ), False, StageStatus.OUTPUT_LIMIT),
        (_report(exit_code=None, signal=11), False, StageStatus.KILLED),
        (_report(exit_code=None, signal=9), False, StageStatus.KILLED),
        (_report(exit_code=126, error="cannot execute /usr/bin/g++"), False, StageStatus.ERROR),
        (_report(exit_code=126, start_failure="cannot execute ./main"), False, "finished"),
    ],
)
def test_status_mapping(report: dict[str, Any], oom: bool, status: StageStatus) -> None:
    verdict = classify(report, _plan(), oom_killed=oom)
    assert verdict.status is StageStatus(status)
    assert (verdict.message is None) == (verdict.status is StageStatus.FINISHED) or report.get(
        "start_failure"
    )
    assert verdict.wall_clock == bool(report.get("timed_out"))


def test_cpu_time_limit_is_judged_on_all_processes() -> None:
    plan = _plan(cpu_limit_s=1.0, wall_limit_s=3.0)
    # the zygote stopped it, or the cgroup says it used more than its second
    assert classify(_report(cpu_exceeded=True, signal=9), plan, oom_killed=False).status == (
        StageStatus.TIME_LIMIT
    )
    over = classify(_report(), plan, oom_killed=False, cpu_ms=1200.0)
    assert over.status is StageStatus.TIME_LIMIT and not over.wall_clock
    assert over.message is not None and "CPU-time limit of 1s" in over.message
    assert classify(_report(), plan, oom_killed=False, cpu_ms=900.0).status == "finished"
    backstop = classify(_report(timed_out=True, signal=9), plan, oom_killed=False, cpu_ms=5.0)
    assert backstop.wall_clock and backstop.message is not None
    assert "wall-clock limit of 3s" in backstop.message


def test_stage_plans() -> None:
    config = NsjailConfig()
    langs = {lang.name: lang for lang in BUILTIN}
    limits = RunLimits(memory_mb=200, max_processes=5, run_timeout_s=3, compile_timeout_s=7)
    spec = RunSpec(language="cpp", code="", limits=limits)
    compile_stage, run_stage = plan(langs["cpp"], spec, config)
    assert compile_stage.name == "compile" and compile_stage.timeout_s == 7
    assert compile_stage.argv[:3] == ("/usr/bin/g++", "-std=c++17", "-O2")
    assert run_stage.timeout_s == 3 and run_stage.address_space_bytes == 200 << 20
    assert run_stage.nproc == 7  # 5 + the zygote and the template
    assert run_stage.cpu_limit_s is None and run_stage.wall_s == 3
    # compile memory: the node's, lowered by the call's
    assert compile_stage.memory_mb == 1024
    small = spec.model_copy(update={"limits": limits.model_copy(update={"compile_memory_mb": 300})})
    assert plan(langs["cpp"], small, config)[0].memory_mb == 300
    assert plan(langs["cpp"], small, config)[0].address_space_bytes == 300 << 20
    # time judged on CPU: the timeout limits CPU time, the wall clock is the backstop
    cpu = limits.model_copy(update={"time_basis": "cpu", "wall_backstop_factor": 2.5})
    run_cpu = plan(langs["cpp"], spec.model_copy(update={"limits": cpu}), config)[-1]
    assert run_cpu.cpu_limit_s == 3 and run_cpu.wall_s == 7.5
    assert run_cpu.to_wire()["timeout"] == 7.5 and run_cpu.to_wire()["cpu_limit_ms"] == 3000
    java_run = plan(langs["java"], spec.model_copy(update={"language": "java"}), config)[-1]
    assert java_run.address_space_bytes is None  # the JVM is bounded by the cgroup
    assert "-Xmx150m" in java_run.argv
    [python_run] = plan(langs["python"], RunSpec(language="python", code="x"), config)
    assert python_run.python_source == "x"


@pytest.mark.parametrize("path", ["", "/abs", "../x", "a/../b", "a//b", "./a", "a\0b", "a\\b"])
def test_request_paths_are_checked(path: str) -> None:
    langs = {lang.name: lang for lang in BUILTIN}
    spec = RunSpec(language="python", code="", files={path: ""})
    with pytest.raises(InvalidSpec):
        check(spec, langs["python"], NsjailConfig())
    spec = RunSpec(language="python", code="", fetch_files=[path])
    with pytest.raises(InvalidSpec):
        check(spec, langs["python"], NsjailConfig())


def test_request_size_is_bounded() -> None:
    langs = {lang.name: lang for lang in BUILTIN}
    spec = RunSpec(language="python", code="x" * 5000)
    with pytest.raises(InvalidSpec, match="more than"):
        check(spec, langs["python"], NsjailConfig(max_input_bytes=1024))


def test_lone_surrogates_are_rejected() -> None:
    langs = {lang.name: lang for lang in BUILTIN}
    with pytest.raises(InvalidSpec, match="code is not valid Unicode"):
        check(RunSpec(language="python", code="print('\ud800')"), langs["python"], NsjailConfig())
    with pytest.raises(InvalidSpec, match="stdin"):
        check(RunSpec(language="python", code="", stdin="\udc80"), langs["python"], NsjailConfig())


def test_output_cap_and_zygote_memory() -> None:
    config = NsjailConfig(max_output_bytes=4 << 20, jail_overhead_mb=96, max_fetch_bytes=16 << 20)
    huge = RunSpec(language="python", code="", limits=RunLimits(max_output_bytes=1 << 30))
    assert output_cap(huge, config) == 4 << 20
    small = RunSpec(language="python", code="", limits=RunLimits(max_output_bytes=1 << 20))
    assert output_cap(small, config) == 1 << 20
    assert zygote_memory_mb(small, config) == 96 + 4
    fetching = small.model_copy(update={"fetch_files": ["out.bin"]})
    assert zygote_memory_mb(fetching, config) == 96 + 4 + 48


def test_config_from_settings() -> None:
    settings = NodeSettings(dev_mode=True, node_slots=3)
    config = NsjailConfig.from_settings(settings)
    assert config.max_jails == 14 and config.require_cgroups is False
    prod = SimpleNamespace(
        node_slots=8, dev_mode=False, memory_reserve_mb=1024, nsjail={"max_uses_per_jail": 7}
    )
    config = NsjailConfig.from_settings(prod)  # type: ignore[arg-type]
    assert config.max_uses_per_jail == 7 and config.require_cgroups is True
    host_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    assert config.jails_memory_mb == max(256, host_mb - 1024)
    fixed = SimpleNamespace(**{**vars(prod), "nsjail": {"jails_memory_mb": 2048}})
    assert NsjailConfig.from_settings(fixed).jails_memory_mb == 2048  # type: ignore[arg-type]


def test_registered_under_its_name() -> None:
    assert "nsjail" in registry.names()
    runtime = registry.create("nsjail", NodeSettings(dev_mode=True))
    assert isinstance(runtime, NsjailBackend)
    assert runtime.stats() == {"warm": 0, "busy": 0, "starting": 0}


def test_stage_cpu_time_comes_from_the_cgroup() -> None:
    # PID 1's own reading of the jail's counter (v1), net of its share, comes first
    report = _report(cpu_ms=7.0, zygote_cpu_ms=2.0, cgroup_cpu_ms=2500.0)
    assert stage_cpu_ms(report, cgroup_ms=9999.0) == 2500.0
    # else the host's reading around the stage (v2), less what PID 1 spent on it
    report = _report(cpu_ms=7.0, zygote_cpu_ms=2.0, cgroup_cpu_ms=None)
    assert stage_cpu_ms(report, cgroup_ms=2502.0) == 2500.0
    assert stage_cpu_ms(report, cgroup_ms=1.0) == 0.0
    # without cgroups, the stage process's own rusage
    assert stage_cpu_ms(report, cgroup_ms=None) == 7.0
