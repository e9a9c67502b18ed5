# Patch FFMA control bits of the gemm_fp8_sm90 kernels inside a host executable's fatbins.
import sys, struct, re
sys.path.insert(0, '/tmp/sass')
from cubin import sections
path, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
b = bytearray(open(path, 'rb').read())
secs = sections(bytes(b))
fb = [(o, s) for n, o, s in secs if n == '.nv_fatbin'][0]
pos, end = fb[0], fb[0] + fb[1]
n_patched = 0; n_k = 0
while pos < end:
    magic, ver, hsz, size = struct.unpack_from('<IHHQ', b, pos)
    if magic != 0xBA55ED50:
        pos += 8; continue
    off = pos + hsz
    while off < pos + hsz + size:
        kind, v2, ehsz, psize = struct.unpack_from('<HHIQ', b, off)
        p = off + ehsz
        if bytes(b[p:p+4]) == b'\x7fELF':
            elf = bytes(b[p:p+psize])
            for n, o, s in sections(elf):
                if n.startswith('.text') and 'gemm_fp8_sm90_kernel' in n:
                    n_k += 1
                    if mode == 'D':  # DeepGEMM's rule, re-derived: see below
                        seg = []
                        for i in range(p + o, p + o + s + 16, 16):
                            lo = struct.unpack_from('<Q', b, i)[0] if i < p + o + s else 0
                            if i < p + o + s and lo & 0xfff == 0x223:
                                seg.append(i); continue
                            if len(seg) >= 8:
                                n = (2 * len(seg) * 9 // 16) // 2
                                seen = set(); last_r = False; last_d = -1
                                for j in seg[:n]:
                                    lo, hi = struct.unpack_from('<QQ', b, j)
                                    d = (lo >> 16) & 0xff
                                    r = bool(hi & (1 << 59))
                                    if r and (d not in seen or (last_r and d == last_d)):
                                        hi ^= (1 << 59) | (1 << 45); r = False
                                        struct.pack_into('<Q', b, j + 8, hi); n_patched += 1
                                    seen.add(d); last_r = r; last_d = d
                            seg = []
                        continue
                    for i in range(p + o, p + o + s, 16):
                        lo, hi = struct.unpack_from('<QQ', b, i)
                        if lo & 0xfff != 0x223: continue
                        if mode == 'Y':   # every FFMA may yield; no operand reuse
                            hi &= ~((1 << 45) | (15 << 58))
                        elif mode == 'N':  # no FFMA yields
                            hi |= (1 << 45)
                        struct.pack_into('<Q', b, i + 8, hi); n_patched += 1
        off += ehsz + psize
    pos += hsz + size
open(out, 'wb').write(b)
print('kernels', n_k, 'FFMAs patched', n_patched)
