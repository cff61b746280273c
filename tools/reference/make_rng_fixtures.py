#!/usr/bin/env python3
# Writes tests/data/rng/numpy_default_rng.txt: what NumPy's default_rng draws, for test_random to
# match bit for bit. A developer tool (run by hand with NumPy installed); not part of the build.
#
#   .venv-ref/bin/python tools/reference/make_rng_fixtures.py [output path]
#
# Besides plain draws from default_rng(seed), it drives NumPy's own Generator.standard_normal
# with a scripted bit generator (a ctypes bitgen_t whose next_uint64 / next_double return values
# we choose) to read the ziggurat's tables and branches as NumPy really runs them, and it reads
# the fi table from the compiled numpy.random._generator module, cross-checked against the probes.
import ctypes
import math
import os
import platform
import random
import struct
import sys
import threading

import numpy as np
import numpy.random._generator as np_generator

SEEDS = [0, 1, 9, 42, 2**32 + 5, 2**63 + 1]
STREAM_SEED = 42
STREAM_N = 100_000  # every layer many times over, ~700 wedge tries, ~25 tail entries
STREAM_HEAD = 1000  # of those written out in full; all of them go into the digest
LAYERS = 256
ZIGGURAT_R = 3.6541528853610088  # the tail starts here (NumPy's ziggurat_nor_r)

out_lines = []


def emit(line):
    out_lines.append(line)


def bits(x):
    """The IEEE-754 bit pattern of a double, as 16 hex digits."""
    return "%016x" % struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def fnv1a64(values):
    """FNV-1a, 64 bit, over the little-endian bytes of each double's bit pattern."""
    h = 0xCBF29CE484222325
    for v in values:
        for byte in struct.pack("<d", float(v)):
            h ^= byte
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def block(kind, values, fmt=bits, **params):
    head = " ".join([f"@ {kind}"] + [f"{k}={v}" for k, v in params.items()] + [f"n={len(values)}"])
    emit(head)
    for v in values:
        emit(fmt(v))


# ---------------------------------------------------------------------------------------------
# A bit generator whose outputs are scripted, so that NumPy's Generator runs on chosen inputs.
# Generator() only needs `.capsule` (a PyCapsule named "BitGenerator" around a bitgen_t) and
# `.lock`; it copies the bitgen_t's function pointers and calls them.
U64FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)
U32FN = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p)
F64FN = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p)


class BitgenT(ctypes.Structure):
    _fields_ = [("state", ctypes.c_void_p), ("next_uint64", U64FN), ("next_uint32", U32FN),
                ("next_double", F64FN), ("next_raw", U64FN)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

# Returned when a script runs dry; a case that needs it is thrown away (see `overrun`).
SENTINEL_U64 = (1 << 9) | 255


class ScriptedBits:
    def __init__(self):
        self.load([], [])
        self._fns = (U64FN(self._next_u64), U32FN(self._next_u32), F64FN(self._next_f64))
        self._struct = BitgenT(None, self._fns[0], self._fns[1], self._fns[2], self._fns[0])
        self._name = ctypes.create_string_buffer(b"BitGenerator")
        self.capsule = _capsule_new(ctypes.addressof(self._struct), ctypes.addressof(self._name),
                                    None)
        self.lock = threading.Lock()

    def load(self, u64s, f64s):
        self.u64s, self.f64s = list(u64s), list(f64s)
        self.used_u64 = self.used_f64 = 0
        self.overrun = False

    def _next_u64(self, _):
        if self.used_u64 >= len(self.u64s):
            self.overrun = True
            return SENTINEL_U64
        self.used_u64 += 1
        return self.u64s[self.used_u64 - 1]

    def _next_f64(self, _):
        if self.used_f64 >= len(self.f64s):
            self.overrun = True
            return 0.5
        self.used_f64 += 1
        return self.f64s[self.used_f64 - 1]

    def _next_u32(self, _):
        self.overrun = True  # standard_normal in double precision never asks for 32 bits
        return 0


SCRIPTED = ScriptedBits()
SCRIPTED_GEN = np.random.Generator(SCRIPTED)


def run_normal(u64s, f64s):
    """NumPy's standard_normal on the given inputs: (value, used u64s, used doubles, overrun)."""
    SCRIPTED.load(u64s, f64s)
    value = float(SCRIPTED_GEN.standard_normal())
    return value, SCRIPTED.used_u64, SCRIPTED.used_f64, SCRIPTED.overrun


def word(idx, sign, rabs):
    """The 64-bit draw that selects layer `idx`, sign bit `sign` and 52-bit magnitude `rabs`."""
    return (rabs << 9) | (sign << 8) | idx


# ---------------------------------------------------------------------------------------------
def probe_tables():
    """wi and ki exactly, from NumPy's behaviour on scripted inputs."""
    wi, ki = [], []
    for idx in range(LAYERS):
        # rabs = 1 gives x = wi[idx] exactly; layer 1 has ki = 0, so it takes the wedge test,
        # which U = 0 passes there (fi[1] < exp(-wi[1]^2 / 2), both near 1).
        value, _, _, overrun = run_normal([word(idx, 0, 1)], [0.0])
        assert not overrun
        wi.append(value)
        # ki[idx] is the least rabs that does not return at once (it then consumes a double).
        lo, hi = 0, 1 << 52  # invariant: rabs < lo returns at once, rabs >= hi does not
        while lo < hi:
            mid = (lo + hi) // 2
            _, _, used_f64, _ = run_normal([word(idx, 0, mid), SENTINEL_U64], [0.0] * 8)
            if used_f64 == 0:
                lo = mid + 1
            else:
                hi = mid
        ki.append(lo)
    return wi, ki


def read_fi_from_module():
    """fi as compiled into numpy.random._generator, and the module's bytes.

    fi is the one run of 256 doubles there that falls strictly from 1.0 to exp(-r^2 / 2).
    """
    data = open(np_generator.__file__, "rb").read()
    tail_f = math.exp(-0.5 * ZIGGURAT_R * ZIGGURAT_R)
    runs = []
    one = struct.pack("<d", 1.0)
    pos = data.find(one)
    while pos != -1:
        if pos + 8 * LAYERS <= len(data):
            v = struct.unpack_from("<%dd" % LAYERS, data, pos)
            if v[-1] == tail_f and all(0 < v[i + 1] < v[i] for i in range(LAYERS - 1)):
                runs.append(list(v))
        pos = data.find(one, pos + 1)
    assert len(runs) == 1, "fi not found exactly once in %s" % np_generator.__file__
    return runs[0], data


def find_in_module(data, fmt, values):
    return data.count(struct.pack("<%d%s" % (len(values), fmt), *values))


# ---------------------------------------------------------------------------------------------
def crafted_cases(ki):
    """Inputs at the branch boundaries, with what NumPy returns and how much it consumes."""
    rnd = random.Random(20240609)
    cases = []

    def add(u64s, f64s, may_run_dry=False):
        value, used_u64, used_f64, overrun = run_normal(u64s, f64s)
        assert may_run_dry or not overrun, (u64s, f64s)
        if not overrun:
            cases.append((u64s, f64s, value, used_u64, used_f64))

    fast_tail = word(200, 0, 12345)  # a draw that returns at once, after a rejection
    for idx in range(LAYERS):
        sign = idx & 1
        if ki[idx] > 0:  # the last magnitude that returns at once
            add([word(idx, sign, ki[idx] - 1)], [])
        if idx == 0:
            continue
        # the first magnitude that takes the wedge test; U = 0 accepts (x is about x[idx-1])
        add([word(idx, 1 - sign, ki[idx]), fast_tail], [0.0])
        # the widest x of the layer with the largest U: rejected, so the next draw counts
        add([word(idx, sign, (1 << 52) - 1), fast_tail], [1.0 - 2.0**-53])
        # a random point of the wedge and a random U: whichever way NumPy decides
        add([word(idx, 1 - sign, rnd.randrange(ki[idx], 1 << 52)), fast_tail], [rnd.random()])

    # The tail (layer 0, rabs >= ki[0]): the result's sign comes from bit 8 of rabs, not from
    # the sign bit; U = 0 makes log1p(-U) = -0, a rejection; U near 1 makes a huge x, rejected.
    for sign in (0, 1):
        for bit8 in (0, 1):
            rabs = ((ki[0] + 0x200) & ~0x1FF) | (bit8 << 8) | 0x5A
            assert rabs >= ki[0] and ((rabs >> 8) & 1) == bit8
            add([word(0, sign, rabs)], [0.5, 0.5])
            add([word(0, sign, rabs)], [0.0, 0.0, 0.25, 0.75])
            add([word(0, sign, rabs)], [1.0 - 2.0**-53, 0.5, 0.125, 0.5])
    for _ in range(24):
        rabs = rnd.randrange(ki[0], 1 << 52)
        add([word(0, rnd.randrange(2), rabs)], [rnd.random() for _ in range(16)], may_run_dry=True)
    # layer 0 inside the base rectangle: the last magnitude before the tail
    add([word(0, 1, ki[0] - 1)], [])
    return cases


def fmt_case(case):
    u64s, f64s, value, used_u64, used_f64 = case
    parts = [str(len(u64s))] + ["%016x" % u for u in u64s]
    parts += [str(len(f64s))] + [bits(d) for d in f64s]
    parts += [bits(value), str(used_u64), str(used_f64)]
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
def stream_with_paths(seed, n):
    """standard_normal() n times on default_rng(seed)'s PCG64, counting what each draw consumed."""
    pcg = np.random.PCG64(seed)
    c = pcg.ctypes
    counts = [0, 0]

    def u64(_):
        counts[0] += 1
        return c.next_uint64(c.state)

    def f64(_):
        counts[1] += 1
        return c.next_double(c.state)

    fns = (U64FN(u64), U32FN(lambda _: c.next_uint32(c.state)), F64FN(f64))
    holder = type("Counting", (), {})()
    holder._struct = BitgenT(None, fns[0], fns[1], fns[2], fns[0])
    holder._name = ctypes.create_string_buffer(b"BitGenerator")
    holder.capsule = _capsule_new(ctypes.addressof(holder._struct), ctypes.addressof(holder._name),
                                  None)
    holder.lock = threading.Lock()
    gen = np.random.Generator(holder)
    values, slow = [], []
    for i in range(n):
        before = list(counts)
        values.append(float(gen.standard_normal()))
        used = (counts[0] - before[0], counts[1] - before[1])
        if used != (1, 0):
            slow.append((i, used[0], used[1], values[-1]))
    reference = np.random.default_rng(seed).standard_normal(n)
    assert [bits(v) for v in reference] == [bits(v) for v in values], "wrapper changed the stream"
    return values, slow


# ---------------------------------------------------------------------------------------------
def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "..", "tests", "data", "rng", "numpy_default_rng.txt")

    emit("# NumPy default_rng reference draws for tests/test_random.cpp; made by")
    emit("# tools/reference/make_rng_fixtures.py. Do not edit by hand: run the script again.")
    emit(f"# numpy {np.__version__}, python {platform.python_version()}, "
         f"{platform.system()} {platform.machine()}, libc {' '.join(platform.libc_ver())}")
    emit("# Block: '@ kind key=value... n=N' then N lines. Doubles are written as the 16 hex")
    emit("# digits of their IEEE-754 bits; parameters as Python float.hex().")

    for seed in SEEDS:
        bg = np.random.default_rng(seed).bit_generator
        block("raw", [int(v) for v in bg.random_raw(48)], fmt=lambda u: "%016x" % u, seed=seed)

        pcg = np.random.default_rng(seed).bit_generator
        c = pcg.ctypes
        block("u32", [c.next_uint32(c.state) for _ in range(33)], fmt=lambda u: "%08x" % u,
              seed=seed)

        # 32-bit draws interleaved with 64-bit ones: the buffered half survives a 64-bit draw
        pcg = np.random.default_rng(seed).bit_generator
        c = pcg.ctypes
        ops = "u32 u64 u32 u32 f64 u32 u64 u64 u32 u32 u32 f64".split()
        mixed = []
        for op in ops:
            if op == "u32":
                mixed.append("u32 %08x" % c.next_uint32(c.state))
            elif op == "u64":
                mixed.append("u64 %016x" % c.next_uint64(c.state))
            else:
                mixed.append("f64 " + bits(c.next_double(c.state)))
        block("mixed", mixed, fmt=str, seed=seed)

        block("random", np.random.default_rng(seed).random(48), seed=seed)
        block("standard_normal", np.random.default_rng(seed).standard_normal(96), seed=seed)
        a = float(np.sqrt(6.0 / 7.0))
        block("uniform", np.random.default_rng(seed).uniform(-a, a, size=32), seed=seed,
              low=(-a).hex(), high=a.hex())
        block("uniform", np.random.default_rng(seed).uniform(2.5, 7.0, size=16), seed=seed,
              low=(2.5).hex(), high=(7.0).hex())
        block("normal", np.random.default_rng(seed).normal(-1.5, 0.02, size=16), seed=seed,
              loc=(-1.5).hex(), scale=(0.02).hex())

    # One long stream: every value goes into the digest and the first ones are written out. Every
    # draw that did not return on its first 64-bit word (wedge tests, the tail) is listed with
    # what it consumed; tail draws (|x| > r, which nothing else returns) also with their value.
    values, slow = stream_with_paths(STREAM_SEED, STREAM_N)
    block("standard_normal", values[:STREAM_HEAD], seed=STREAM_SEED)
    emit(f"@ standard_normal_digest seed={STREAM_SEED} count={STREAM_N} "
         f"fnv1a64={fnv1a64(values):016x} n=0")
    block("standard_normal_slow", slow,
          fmt=lambda s: f"{s[0]} {s[1]} {s[2]}" + (f" {bits(s[3])}" if abs(s[3]) > ZIGGURAT_R else ""),
          seed=STREAM_SEED, count=STREAM_N)

    # The ziggurat tables NumPy runs with.
    wi, ki = probe_tables()
    fi, module = read_fi_from_module()
    assert find_in_module(module, "d", wi) == 1, "probed wi is not the module's table"
    assert find_in_module(module, "Q", ki) == 1, "probed ki is not the module's table"
    block("table", ki, fmt=lambda u: "%016x" % u, name="ki")
    block("table", wi, name="wi")
    block("table", fi, name="fi")
    block("crafted_normal", crafted_cases(ki), fmt=fmt_case)

    # The lecture's example weights: default_rng(9), Glorot-normal, drawn in this order.
    rng = np.random.default_rng(9)
    lecture = [("Wq.0", 3, 1), ("Wq.1", 3, 1), ("Wk.0", 3, 1), ("Wk.1", 3, 1),
               ("Wv.0", 3, 2), ("Wv.1", 3, 2), ("Wo", 4, 3)]
    for name, rows, cols in lecture:
        sd = np.sqrt(2.0 / (rows + cols))
        w = rng.normal(0.0, sd, size=(rows, cols))
        block("lecture", w.ravel(), seed=9, name=name, rows=rows, cols=cols, sd=float(sd).hex())

    # Each initialisation scheme as NumPy code would write it, one fresh generator per matrix.
    rows, cols = 5, 3
    schemes = [
        ("glorot_normal", 0.0, lambda r: r.normal(0.0, np.sqrt(2.0 / (rows + cols)), (rows, cols))),
        ("glorot_uniform", 0.0, lambda r: r.uniform(-np.sqrt(6.0 / (rows + cols)),
                                                    np.sqrt(6.0 / (rows + cols)), (rows, cols))),
        ("he_normal", 0.0, lambda r: r.normal(0.0, np.sqrt(2.0 / rows), (rows, cols))),
        ("normal", 0.02, lambda r: r.normal(0.0, 0.02, (rows, cols))),
        ("zeros", 0.0, lambda r: np.zeros((rows, cols))),
    ]
    for name, std, draw in schemes:
        w = draw(np.random.default_rng(1234))
        block("init", w.ravel(), seed=1234, scheme=name, std=float(std).hex(), rows=rows,
              cols=cols)

    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(out_lines) + "\n")
    tails = sum(1 for s in slow if abs(s[3]) > ZIGGURAT_R)  # only the tail returns |x| > r
    print(f"wrote {out_path}: {os.path.getsize(out_path)} bytes; stream has {len(slow)} slow "
          f"draws, {tails} from the tail", file=sys.stderr)


if __name__ == "__main__":
    main()
