#!/usr/bin/env python3
"""Compares the device code of two nvcc objects of one kernel unit: `scripts/fatbin_diff.py A.o B.o`.

For a change that should not touch the kernels (moving files, renaming, refactoring host code), build both trees
with their own `MOE_GEMM_CUDA_CACHE` and compare each unit's objects. Every fatbin entry is compared: PTX as text,
each cubin section by section in order, code, constants, relocations and attributes alike. Only `.strtab` is
skipped: nvcc names internal-linkage symbols `_INTERNAL_<hash of the source path>_...`, so a moved file changes
those names and nothing else. Exit status 0 when everything else is equal. Stdlib Python and binutils' objcopy:
no cuobjdump is needed (the provisioned toolchain has none)."""
import struct, subprocess, sys, tempfile
def fatbin(o):
    with tempfile.NamedTemporaryFile() as t:
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", o, t.name], check=True)
        return open(t.name, "rb").read()
def entries(fb):
    out, off = [], 0
    while off + 16 <= len(fb):
        magic, ver, hs, fs = struct.unpack_from("<IHHQ", fb, off)
        if magic != 0xBA55ED50: break
        e, end = off + hs, off + hs + fs
        while e < end:
            kind, _, ehs, size = struct.unpack_from("<HHIQ", fb, e)
            arch = struct.unpack_from("<I", fb, e + 28)[0]
            flags = struct.unpack_from("<Q", fb, e + 40)[0]
            out.append((kind, arch, flags, fb[e + ehs:e + ehs + size]))
            e += ehs + size
        off = end
    return out
def sections(elf):
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3a)
    raw = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    so = raw[shstrndx][4]
    def nm(n): return elf[so + n:elf.index(b"\0", so + n)].decode()
    return [(nm(r[0]), r[1], elf[r[4]:r[4] + r[5]] if r[1] != 8 else b"") for r in raw]
def main(a, b):
    ea, eb = entries(fatbin(a)), entries(fatbin(b))
    if [(k, ar) for k, ar, _, _ in ea] != [(k, ar) for k, ar, _, _ in eb]:
        print("DIFFERENT entry lists", [(k, ar) for k, ar, _, _ in ea], [(k, ar) for k, ar, _, _ in eb]); return 1
    bad = 0; ntext = 0
    for (k, ar, fl, pa), (_, _, _, pb) in zip(ea, eb):
        if fl & 0x2000:  # compressed: compare whole
            print(f"entry kind {k} sm_{ar}: compressed, {'same' if pa == pb else 'DIFFERENT'}"); bad += pa != pb; continue
        if k != 2:
            print(f"entry kind {k} (PTX) sm_{ar}: {'same' if pa == pb else 'DIFFERENT'} ({len(pa)} bytes)")
            bad += pa != pb
            continue
        sa, sb = sections(pa), sections(pb)
        # Names of internal-linkage symbols carry a hash of the source path: match sections by order.
        if len(sa) != len(sb): print("section counts differ"); bad += 1; continue
        for (na, ta, da), (nb, tb, db) in zip(sa, sb):
            if na.startswith(".text"): ntext += 1
            if na == ".strtab":  # the symbol names: internal ones carry a hash of the source path
                continue
            if da != db:
                bad += 1; print(f"  sm_{ar} {na}: {len(da)} vs {len(db)} bytes DIFFER")
    print(f"{a}: {ntext} code sections compared, {bad} differing")
    return bad
sys.exit(1 if main(sys.argv[1], sys.argv[2]) else 0)
