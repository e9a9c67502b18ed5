import sys, json, struct, re
sys.path.insert(0,'/tmp/sass')
from kernels_of import kernels
opmap={int(k,16):v.split('.')[0] for k,v in json.load(open('/tmp/sass/opmap.json')).items()}
def dis(text):
    out=[]
    for i in range(0,len(text),16):
        lo,hi=struct.unpack_from('<QQ',text,i)
        op=lo&0xfff
        mn=opmap.get(op,'op%03x'%op)
        if op==0x9c5: mn='WG.ARRIVE' if (lo>>32)==0 else 'WG.DEPBAR'
        out.append((i//16, mn, lo, hi))
    return out
