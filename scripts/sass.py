#!/usr/bin/env python3
"""Reads the sm_90 SASS of fanout's kernels where no cuobjdump/nvdisasm is installed.

FILE is anything holding fatbins: `nvcc -fatbin` output, an object, or a linked executable (its
.nv_fatbin section); only the uncompressed cubins in it are read.

  sass.py kernels FILE [--tag T]          each kernel's name and size
  sass.py compare A B [--tag T]           per kernel: byte-identical or not
  sass.py ffma FILE [--tag T]             promotion FFMAs: count, fragment/accumulator in one
                                          register bank (same parity), operand reuse set
  sass.py wgmma-gaps FILE [--tag T]       per warpgroup.arrive … depbar group: instructions
                                          between consecutive QGMMAs (0 = issued back to back)
  sass.py patch-ffma MODE IN OUT [--tag T]  experiments only: rewrite every FFMA's control bits in
                                          IN's kernels (Y: all yield, no reuse; N: none yields;
                                          D: DeepGEMM's rule re-derived) and write OUT

The encoding, checked against an Nsight Compute SASS listing of the FP8 GEMM (PERF.md, 2026-12-04):
opcode in the low word's bits 0-11 (FFMA 0x223, QGMMA 0x9f3, WARPGROUP.ARRIVE/DEPBAR 0x9c5), Rd
bits 16-23, Ra 24-31, Rb 32-39, Rc the high word's bits 0-7; in the high word bit 45 clear lets the
warp yield, bits 58-61 are the operand reuse flags. --tag picks kernels whose section name holds it
(default: gemm_fp8_sm90_kernel).
"""
import argparse
import re
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
FFMA, QGMMA, WARPGROUP = 0x223, 0x9F3, 0x9C5
YIELD_BIT, REUSE_BITS, REUSE_B = 1 << 45, 15 << 58, 1 << 59


def elf_sections(elf, base=0):
    """(name, offset, size) of every section of the ELF image at elf[base:]."""
    shoff, = struct.unpack_from('<Q', elf, base + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', elf, base + 0x3A)
    heads = [struct.unpack_from('<IIQQQQ', elf, base + shoff + i * shentsize) for i in range(shnum)]
    strtab = base + heads[shstrndx][4]
    out = []
    for name, _typ, _flags, _addr, off, size in heads:
        end = elf.index(b'\0', strtab + name)
        out.append((elf[strtab + name:end].decode(), base + off, size))
    return out


def cubins(data):
    """Offsets of the cubins (ELF images) inside every fatbin container in data."""
    lo, hi = 0, len(data)
    if data[:4] == b'\x7fELF':
        fat = [(o, s) for n, o, s in elf_sections(data) if n == '.nv_fatbin']
        if fat:
            lo, hi = fat[0][0], fat[0][0] + fat[0][1]
    out, pos = [], lo
    while pos + 16 <= hi:
        magic, _ver, head, size = struct.unpack_from('<IHHQ', data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry = pos + head
        while entry < pos + head + size:
            _kind, _ver2, entry_head, payload = struct.unpack_from('<HHIQ', data, entry)
            if data[entry + entry_head:entry + entry_head + 4] == b'\x7fELF':
                out.append(entry + entry_head)
            entry += entry_head + payload
        pos += head + size
    return out


def kernels(data, tag):
    """{template part of the kernel's name: (offset, size) of its .text} for kernels matching tag."""
    out = {}
    for base in cubins(data):
        for name, off, size in elf_sections(data, base):
            if name.startswith('.text.') and tag in name:
                # Past the tag: the template arguments, free of the file-dependent anonymous namespace.
                out[name.split(tag, 1)[1] or name] = (off, size)
    return out


def short(key):
    m = re.match(r'ILi(\d+)ELi(\d+)ELi(\d+)ELNS1_6LayoutE(\d)ELi(\d)', key)
    return '%sx%s/%s stages, layout %s, cluster %s' % m.groups() if m else key[:60]


def instructions(data, off, size):
    return [struct.unpack_from('<QQ', data, off + i) for i in range(0, size, 16)]


def cmd_kernels(a):
    data = open(a.file, 'rb').read()
    for k, (_off, size) in sorted(kernels(data, a.tag).items()):
        print('%-44s %7d bytes' % (short(k), size))


def cmd_compare(a):
    da, db = open(a.a, 'rb').read(), open(a.b, 'rb').read()
    ka, kb = kernels(da, a.tag), kernels(db, a.tag)
    same = 0
    for k in sorted(set(ka) | set(kb)):
        if k not in ka or k not in kb:
            print('%-44s only in %s' % (short(k), a.a if k in ka else a.b))
            continue
        (oa, sa), (ob, sb) = ka[k], kb[k]
        equal = da[oa:oa + sa] == db[ob:ob + sb]
        same += equal
        print('%-44s %s' % (short(k), 'identical' if equal else 'differs'))
    print('%d of %d identical' % (same, len(set(ka) | set(kb))))


def cmd_ffma(a):
    data = open(a.file, 'rb').read()
    for k, (off, size) in sorted(kernels(data, a.tag).items()):
        f = [(lo, hi) for lo, hi in instructions(data, off, size) if lo & 0xFFF == FFMA]
        same_bank = sum(1 for lo, hi in f if (lo >> 24) & 1 == hi & 1)
        reuse = sum(1 for _lo, hi in f if hi & REUSE_BITS)
        print('%-44s FFMA %4d  Ra/Rc in one bank %4d  reuse set %4d' % (short(k), len(f), same_bank, reuse))


def cmd_wgmma_gaps(a):
    data = open(a.file, 'rb').read()
    for k, (off, size) in sorted(kernels(data, a.tag).items()):
        groups, issued = [], None  # issued: instruction indices of the open group's QGMMAs
        for i, (lo, _hi) in enumerate(instructions(data, off, size)):
            op = lo & 0xFFF
            if op == WARPGROUP and (lo >> 32) == 0:  # arrive: a group opens
                issued = []
            elif op == WARPGROUP and issued is not None:  # depbar: it closes
                if issued:
                    groups.append(tuple(issued[j + 1] - issued[j] - 1 for j in range(len(issued) - 1)))
                issued = None
            elif op == QGMMA and issued is not None:
                issued.append(i)
        print('%-44s %s' % (short(k), ' '.join(str(g) for g in groups)))


def deepgemm_rule(data, run):
    """DeepGEMM's FFMA rule, re-derived: in the first 9/16 of a run of >= 8 FFMAs, an FFMA that
    reuses operand b and writes a register not yet written in the run (or the one the previous,
    reusing FFMA wrote) yields instead and drops its reuse flag."""
    seen, last_reused, last_dst, changed = set(), False, -1, 0
    for at in run[:len(run) * 9 // 16]:
        lo, hi = struct.unpack_from('<QQ', data, at)
        dst = (lo >> 16) & 0xFF
        reused = bool(hi & REUSE_B)
        if reused and (dst not in seen or (last_reused and dst == last_dst)):
            struct.pack_into('<Q', data, at + 8, hi ^ (REUSE_B | YIELD_BIT))
            reused, changed = False, changed + 1
        seen.add(dst)
        last_reused, last_dst = reused, dst
    return changed


def cmd_patch_ffma(a):
    data = bytearray(open(a.input, 'rb').read())
    changed = 0
    for _k, (off, size) in kernels(bytes(data), a.tag).items():
        run = []
        for at in list(range(off, off + size, 16)) + [None]:
            is_ffma = at is not None and struct.unpack_from('<Q', data, at)[0] & 0xFFF == FFMA
            if is_ffma and a.mode in 'YN':
                hi = struct.unpack_from('<Q', data, at + 8)[0]
                hi = hi & ~(YIELD_BIT | REUSE_BITS) if a.mode == 'Y' else hi | YIELD_BIT
                struct.pack_into('<Q', data, at + 8, hi)
                changed += 1
            elif is_ffma:
                run.append(at)
            elif a.mode == 'D':
                if len(run) >= 8:
                    changed += deepgemm_rule(data, run)
                run = []
    open(a.output, 'wb').write(data)
    print('FFMAs changed: %d' % changed)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    for name, args in (('kernels', ['file']), ('compare', ['a', 'b']), ('ffma', ['file']),
                       ('wgmma-gaps', ['file']), ('patch-ffma', ['mode', 'input', 'output'])):
        p = sub.add_parser(name)
        for arg in args:
            p.add_argument(arg, choices=['Y', 'N', 'D'] if arg == 'mode' else None)
        p.add_argument('--tag', default='gemm_fp8_sm90_kernel')
    a = ap.parse_args()
    {'kernels': cmd_kernels, 'compare': cmd_compare, 'ffma': cmd_ffma, 'wgmma-gaps': cmd_wgmma_gaps,
     'patch-ffma': cmd_patch_ffma}[a.cmd](a)


if __name__ == '__main__':
    sys.exit(main())
