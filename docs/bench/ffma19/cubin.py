import struct, sys
def fatbin_elfs(d):
    # fatbin container: magic, version(2), header size(2), size(8); entries follow
    magic, ver, hsz, size = struct.unpack_from('<IHHQ', d, 0)
    assert magic == 0xBA55ED50
    off = hsz; out = []
    while off < hsz + size:
        kind, ver2, ehsz, psize = struct.unpack_from('<HHIQ', d, off)
        # flags etc. after; payload after ehsz bytes
        out.append((kind, off + ehsz, psize))
        off += ehsz + psize
    return out
def sections(elf):
    e_shoff, = struct.unpack_from('<Q', elf, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from('<HHH', elf, 0x3A)
    shs = []
    for i in range(e_shnum):
        name, typ, flags, addr, off, size = struct.unpack_from('<IIQQQQ', elf, e_shoff + i*e_shentsize)
        shs.append([name, typ, off, size])
    stroff = shs[e_shstrndx][2]
    res = []
    for name, typ, off, size in shs:
        end = elf.index(b'\0', stroff + name)
        res.append((elf[stroff+name:end].decode(), off, size))
    return res
