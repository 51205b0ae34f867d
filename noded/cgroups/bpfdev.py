"""A cgroup v2 device program: the GPU device fence where there is no ``devices`` controller.

cgroup v2 has no devices controller; the kernel instead runs the ``BPF_PROG_TYPE_CGROUP_DEVICE``
programs attached to a task's cgroup (and its ancestors) on every open and mknod of a device
file, and refuses with EPERM when one returns 0. No Debian package gives Python a BPF loader
(bcc needs LLVM and kernel headers at run time; libbpf needs a compiled object), and the
program we need is a dozen instructions, so this module assembles it by hand and loads and
attaches it with the bpf(2) system call through ctypes.

The program reads the three 32-bit fields of ``struct bpf_cgroup_dev_ctx``::

    access_type  = (access << 16) | type   # type: 1 block, 2 char; access: 1 mknod, 2 read, 4 write
    major, minor

and answers: not a character device, or no read/write asked (mknod) -> allow; one of the
allowed ``major:minor`` -> allow; any other device of a fenced major -> deny; else allow.

Attached with ``BPF_F_ALLOW_MULTI``: programs of the ancestors (systemd's ``DevicePolicy``, a
container runtime's) still run, and an access is allowed only if every one allows it. The
cgroup holds the program; the file descriptor is closed after attaching and the program goes
away with the group (rmdir). Re-applying the fence to a group (noded restarted and re-adopted
the job) attaches the new program first and then detaches the ones attached before, so the
group is never unfenced in between.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager

from noded.cgroups.devrules import DeviceRules

# bpf(2) commands (include/uapi/linux/bpf.h, enum bpf_cmd).
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # enum bpf_attach_type
BPF_F_ALLOW_MULTI = 1 << 1

# The system call's number per machine (asm/unistd_64.h, asm-generic/unistd.h).
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}

# struct bpf_cgroup_dev_ctx
DEVCG_DEV_CHAR = 2
DEVCG_ACC_READ_WRITE = (2 | 4) << 16
_CTX_ACCESS, _CTX_MAJOR, _CTX_MINOR = 0, 4, 8

# Instruction opcodes used (include/uapi/linux/bpf_common.h): class | size/op | source.
_LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_ALU64_MOV_X = 0xBF  # BPF_ALU64 | BPF_MOV | BPF_X: dst = src
_ALU64_MOV_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K: dst &= imm (32-bit, upper half cleared)
_JMP_JA = 0x05  # BPF_JMP | BPF_JA: goto +off
_JMP_JEQ_K = 0x15  # if dst == imm goto +off
_JMP_JNE_K = 0x55  # if dst != imm goto +off
_JMP_EXIT = 0x95  # return r0

LICENSE = b"Apache-2.0"  # no GPL-only helper is called, so any licence string loads
PROG_NAME = b"trellis_gpufnc"  # at most 15 bytes: shown by bpftool prog list
LOG_SIZE = 1 << 16


class BpfError(OSError):
    """The kernel refused to load, attach or detach the device program."""


class _Insn(ctypes.Structure):
    """struct bpf_insn: opcode, dst and src registers (4 bits each), offset, immediate."""

    _fields_ = [
        ("code", ctypes.c_uint8),
        ("dst_reg", ctypes.c_uint8, 4),
        ("src_reg", ctypes.c_uint8, 4),
        ("off", ctypes.c_int16),
        ("imm", ctypes.c_int32),
    ]


class _ProgLoadAttr(ctypes.Structure):
    """The BPF_PROG_LOAD member of union bpf_attr, as far as we set it."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


class _AttachAttr(ctypes.Structure):
    """The BPF_PROG_ATTACH / BPF_PROG_DETACH member."""

    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
    ]


class _QueryAttr(ctypes.Structure):
    """The BPF_PROG_QUERY member."""

    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
    ]


class _GetFdAttr(ctypes.Structure):
    """The BPF_*_GET_FD_BY_ID member."""

    _fields_ = [("prog_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32),
                ("open_flags", ctypes.c_uint32)]


# -- assembling -----------------------------------------------------------------------------

Insn = tuple[int, int, int, "int | str", int]  # (code, dst, src, offset or label, imm)


def _resolve(program: list[Insn], labels: dict[str, int]) -> list[tuple[int, int, int, int, int]]:
    """Replace label jump targets by offsets relative to the next instruction."""
    out = []
    for pc, (code, dst, src, off, imm) in enumerate(program):
        if isinstance(off, str):
            off = labels[off] - (pc + 1)
        out.append((code, dst, src, off, imm))
    return out


def assemble(rules: DeviceRules) -> list[tuple[int, int, int, int, int]]:
    """The device program for ``rules`` as (code, dst, src, off, imm) instructions.

    Registers: r1 the context (set by the kernel), r2 access_type, r3 its device type,
    r4 major, r5 minor, r0 the verdict.
    """
    p: list[Insn] = [
        (_LDX_MEM_W, 2, 1, _CTX_ACCESS, 0),
        (_ALU64_MOV_X, 3, 2, 0, 0),
        (_ALU_AND_K, 3, 0, 0, 0xFFFF),
        (_JMP_JNE_K, 3, 0, "allow", DEVCG_DEV_CHAR),  # block devices: not ours to fence
        (_ALU_AND_K, 2, 0, 0, DEVCG_ACC_READ_WRITE),
        (_JMP_JEQ_K, 2, 0, "allow", 0),  # mknod only: see noded.cgroups.devrules
        (_LDX_MEM_W, 4, 1, _CTX_MAJOR, 0),
        (_LDX_MEM_W, 5, 1, _CTX_MINOR, 0),
    ]
    for major, minor in rules.allowed:
        # if major != M skip the next two; if minor != N skip the next one; goto allow
        p += [
            (_JMP_JNE_K, 4, 0, 2, major),
            (_JMP_JNE_K, 5, 0, 1, minor),
            (_JMP_JA, 0, 0, "allow", 0),
        ]
    for major in rules.fenced_majors:
        p.append((_JMP_JEQ_K, 4, 0, "deny", major))
    labels = {"allow": len(p)}
    p += [(_ALU64_MOV_K, 0, 0, 0, 1), (_JMP_EXIT, 0, 0, 0, 0)]
    if rules.fenced_majors:
        # (emitted only when something jumps here: the verifier refuses unreachable code)
        labels["deny"] = len(p)
        p += [(_ALU64_MOV_K, 0, 0, 0, 0), (_JMP_EXIT, 0, 0, 0, 0)]
    return _resolve(p, labels)


def run(program: list[tuple[int, int, int, int, int]], access_type: int, major: int,
        minor: int) -> int:
    """Interpret ``program`` as the kernel would for one access: tests check the assembled
    program's decisions on every device without loading it."""
    regs = [0] * 11
    ctx = {_CTX_ACCESS: access_type, _CTX_MAJOR: major, _CTX_MINOR: minor}
    pc = 0
    for _ in range(len(program) + 1):  # no backward jumps: each instruction runs once at most
        code, dst, src, off, imm = program[pc]
        pc += 1
        if code == _LDX_MEM_W:
            regs[dst] = ctx[off]
        elif code == _ALU64_MOV_X:
            regs[dst] = regs[src]
        elif code == _ALU64_MOV_K:
            regs[dst] = imm
        elif code == _ALU_AND_K:
            regs[dst] = (regs[dst] & imm) & 0xFFFFFFFF
        elif code == _JMP_JA:
            pc += off
        elif code == _JMP_JEQ_K:
            pc += off if regs[dst] == imm else 0
        elif code == _JMP_JNE_K:
            pc += off if regs[dst] != imm else 0
        elif code == _JMP_EXIT:
            return regs[0]
        else:
            raise ValueError(f"opcode {code:#x} is not one this module emits")
    raise ValueError("program ran past its end")


# -- the system call ------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _sys_bpf_number() -> int:
    machine = platform.machine()
    if machine not in _SYS_BPF:
        raise BpfError(errno.ENOSYS, f"no known bpf(2) system call number for {machine}")
    return _SYS_BPF[machine]


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    # The kernel requires the bytes of bpf_attr past what it knows to be zero, and accepts a
    # size smaller than its own union: pass exactly our structure.
    result = _libc.syscall(_sys_bpf_number(), ctypes.c_int(cmd), ctypes.byref(attr),
                           ctypes.c_uint(ctypes.sizeof(attr)))
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, f"{what}: {os.strerror(code)}")
    return int(result)


def load(rules: DeviceRules) -> int:
    """Load the device program for ``rules``; returns its file descriptor (the caller closes
    it). A refusal by the verifier carries the verifier's log in its message."""
    code = assemble(rules)
    insns = (_Insn * len(code))()
    for i, (op, dst, src, off, imm) in enumerate(code):
        insns[i].code, insns[i].dst_reg, insns[i].src_reg = op, dst, src
        insns[i].off, insns[i].imm = off, imm
    licence = ctypes.create_string_buffer(LICENSE)
    attr = _ProgLoadAttr(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(code),
                         insns=ctypes.addressof(insns), license=ctypes.addressof(licence),
                         prog_name=PROG_NAME)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the GPU device program")
    except BpfError as exc:
        if exc.errno != errno.EACCES and exc.errno != errno.EINVAL:
            raise
    # Refused by the verifier: load again with its log, to say why.
    log_buf = ctypes.create_string_buffer(LOG_SIZE)
    attr.log_level, attr.log_size = 1, LOG_SIZE
    attr.log_buf = ctypes.addressof(log_buf)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the GPU device program")
    except BpfError as exc:
        verifier = log_buf.value.decode(errors="replace").strip().splitlines()[-3:]
        raise BpfError(exc.errno, f"{exc.strerror}; verifier: {' | '.join(verifier)}") from None


def attached(cgroup_fd: int) -> list[int]:
    """Ids of the device programs attached to the cgroup itself (not its ancestors)."""
    ids = (ctypes.c_uint32 * 64)()
    attr = _QueryAttr(target_fd=cgroup_fd, attach_type=BPF_CGROUP_DEVICE,
                      prog_ids=ctypes.addressof(ids), prog_cnt=len(ids))
    _bpf(BPF_PROG_QUERY, attr, "listing the group's device programs")
    return [ids[i] for i in range(min(attr.prog_cnt, len(ids)))]


@contextmanager
def _prog_fd(prog_id: int) -> Iterator[int]:
    fd = _bpf(BPF_PROG_GET_FD_BY_ID, _GetFdAttr(prog_id=prog_id),
              f"opening device program {prog_id}")
    try:
        yield fd
    finally:
        os.close(fd)


def fence(cgroup_fd: int, rules: DeviceRules) -> int:
    """Make ``rules`` the device program of the cgroup open at ``cgroup_fd``, replacing any
    attached before (attach first, then detach: never a moment unfenced). Returns how many
    earlier programs were detached."""
    before = attached(cgroup_fd)
    prog = load(rules)
    try:
        _bpf(BPF_PROG_ATTACH, _AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=prog,
                                          attach_type=BPF_CGROUP_DEVICE,
                                          attach_flags=BPF_F_ALLOW_MULTI),
             "attaching the GPU device program")
    finally:
        os.close(prog)  # the cgroup holds the program now
    for prog_id in before:
        with _prog_fd(prog_id) as old:
            _bpf(BPF_PROG_DETACH, _AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=old,
                                              attach_type=BPF_CGROUP_DEVICE),
                 f"detaching the earlier device program {prog_id}")
    return len(before)


def probe() -> str | None:
    """Why device programs cannot be loaded here (None: they can): an allow-all program is
    loaded and dropped."""
    try:
        os.close(load(DeviceRules((), (), ())))
    except BpfError as exc:
        return f"the kernel refuses cgroup device programs: {exc.strerror}"
    return None
