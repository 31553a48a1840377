import json,sys
from multiprocessing import Pool
sys.path.insert(0,'.')
sys.argv=[sys.argv[0]]+sys.argv[1:]
from benchmarks import autopilot as ab
from tests.support import pilot_sim
seeds=int(sys.argv[1]); out=sys.argv[2]
profs=[("quiet", pilot_sim.QUIET),("noisy", pilot_sim.Noise()),("box", pilot_sim.BOX)]
def one(a):
    return a[0], ab.simulated(seeds, a[1], 500, None)
if __name__=='__main__':
    with Pool(2) as p: res=dict(p.map(one, profs))
    json.dump({'simulated':res}, open(out,'w'))
