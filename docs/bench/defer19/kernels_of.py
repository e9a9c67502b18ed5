import struct, sys
sys.path.insert(0, '/tmp/sass')
from cubin import sections
def kernels(path, tag='gemm_fp8_sm90_kernel'):
    b = open(path, 'rb').read()
    if b[:4] == b'\x7fELF' and any(n == '.nv_fatbin' for n, o, s in sections(b)):
        fb = [(o, s) for n, o, s in sections(b) if n == '.nv_fatbin'][0]
        pos, end = fb[0], fb[0] + fb[1]
    else:
        pos, end = 0, len(b)
    out = {}
    while pos < end:
        magic, ver, hsz, size = struct.unpack_from('<IHHQ', b, pos)
        if magic != 0xBA55ED50:
            pos += 8; continue
        off = pos + hsz
        while off < pos + hsz + size:
            kind, v2, ehsz, psize = struct.unpack_from('<HHIQ', b, off)
            p = off + ehsz
            if b[p:p+4] == b'\x7fELF':
                elf = b[p:p+psize]
                for n, o, s in sections(elf):
                    if n.startswith('.text') and tag in n:
                        out[n.split(tag)[1]] = elf[o:o+s]
            off += ehsz + psize
        pos += hsz + size
    return out
