import json,sys,statistics as st
def flat(rs):
    out=[]
    for r in rs:
        for x in r:
            out.append(x)
    return out
for f in sys.argv[1:]:
    d=json.load(open(f))['simulated']
    print(f)
    for prof,v in d.items():
        row=[]
        for sc,s in v.items():
            if sc=='equal':
                row.append(f"eq:{sum(s['changes'])}"); continue
            rx=[x for x in flat(s['reactions']) if isinstance(x,int)]
            miss=sum(1 for x in flat(s['reactions']) if x is None)
            row.append(f"{sc} {s['vs_best_fixed']['median']:.3f}/{s['vs_oracle']['median']:.3f} r{st.median(rx) if rx else '-'}{'m'+str(miss) if miss else ''} u{sum(s['moves_between_equal_ranks'])}")
        print(f"  {prof:6s}", ' | '.join(row))
