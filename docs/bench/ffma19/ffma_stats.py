import sys, struct, collections; sys.path.insert(0,'/tmp/sass')
from cubin import *
d=open(sys.argv[1],'rb').read()
kind, off, psize = [e for e in fatbin_elfs(d) if d[e[1]:e[1]+4]==b'\x7fELF'][0]
elf=d[off:off+psize]
for n,o,s in sections(elf):
    if not (n.startswith('.text') and 'gemm_fp8_sm90_kernel' in n): continue
    text=elf[o:o+s]
    ins=[struct.unpack_from('<QQ',text,i) for i in range(0,len(text),16)]
    f=[(lo,hi) for lo,hi in ins if lo&0xfff==0x223]
    same_ac=sum(1 for lo,hi in f if ((lo>>24)&1)==(hi&1))
    reuse_b=sum(1 for lo,hi in f if (hi>>58)&15)
    import re
    m=re.search(r'kernelILi(\d+)ELi(\d+)ELi(\d+)ELNS1_6LayoutE(\d)ELi(\d)',n)
    print(m.groups(), 'FFMA',len(f),'Ra/Rc same parity',same_ac,'reuse set',reuse_b)
