"""A cgroup v2 device allow-list: an eBPF program of type CGROUP_DEVICE, built here
from raw instructions and loaded and attached with the bpf(2) system call."""

from __future__ import annotations

import ctypes
import os
import platform
import struct

from gpusched.agent.cgroups.devices import DeviceRule, check_rules

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2

# struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }
# access_type low 16 bits: BPF_DEVCG_DEV_BLOCK (1) or BPF_DEVCG_DEV_CHAR (2).
_DEV_KIND = {"b": 1, "c": 2}

_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_AND64_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K
_MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K
_EXIT = 0x95  # BPF_JMP | BPF_EXIT


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(rules: list[DeviceRule]) -> bytes:
    """Instructions returning 1 (allow) for a device matching a rule, else 0."""
    check_rules(rules)
    prog = [
        _insn(_LDX_W, dst=2, src=1, off=0),  # r2 = ctx->access_type
        _insn(_AND64_K, dst=2, imm=0xFFFF),  # r2 = device kind
        _insn(_LDX_W, dst=3, src=1, off=4),  # r3 = ctx->major
        _insn(_LDX_W, dst=4, src=1, off=8),  # r4 = ctx->minor
    ]
    for kind, major, minor in rules:
        checks = [(2, _DEV_KIND[kind]), (3, major)]
        if minor is not None:
            checks.append((4, minor))
        n = len(checks)
        for i, (reg, value) in enumerate(checks):
            # skip the rest of this rule: the remaining checks plus mov and exit
            prog.append(_insn(_JNE_K, dst=reg, off=(n - 1 - i) + 2, imm=value))
        prog.append(_insn(_MOV64_K, dst=0, imm=1))
        prog.append(_insn(_EXIT))
    prog.append(_insn(_MOV64_K, dst=0, imm=0))
    prog.append(_insn(_EXIT))
    return b"".join(prog)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(f"bpf(2) number unknown for {platform.machine()}")
    ret = _libc.syscall(
        ctypes.c_long(number), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr))
    )
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def load_device_program(rules: list[DeviceRule]) -> int:
    """Load the allow-list program; returns its fd (the caller closes it)."""
    code = device_program(rules)
    insns = ctypes.create_string_buffer(code, len(code))
    license = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into(
        "<IIQQIIQ",
        attr,
        0,
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(code) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license),
        0,
        0,
        0,
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        struct.pack_into("<IIQ", attr, 32, 1, len(log), ctypes.addressof(log))
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError:
            pass
        detail = log.value.decode(errors="replace").strip().splitlines()
        reason = f"; verifier: {detail[-1]}" if detail else ""
        raise OSError(
            exc.errno, f"loading the device program failed: {exc.strerror}{reason}"
        ) from None


def attach_device_program(cgroup_fd: int, prog_fd: int) -> None:
    attr = ctypes.create_string_buffer(128)
    struct.pack_into(
        "<IIII", attr, 0, cgroup_fd, prog_fd, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI
    )
    _bpf(BPF_PROG_ATTACH, attr)
