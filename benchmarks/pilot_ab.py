"""A/B of the pilot on real local ranks: moving16, the pilot arm, in the tree given."""
import json, sys, tempfile, time
from pathlib import Path
root = Path(sys.argv[1]); sys.path.insert(0, str(root))
from telemetry.arrowlog import read_events, read_updates
from tests.support.fleet import launch_args, run_fleet
MODEL = ["--depth", "2", "--width", "128", "--heads", "2"]
tmp = Path(tempfile.mkdtemp(prefix="ab-"))
data = Path(sys.argv[2])
slow = "2,1,1,1@0;1,1,3,1@50"
out = tmp / "run"
train = ("--local-batches", "4,4,4,4", "--updates", "100", *MODEL, "--device", "cpu", "--telemetry-port-base", "0", "--log-every", "1000", "--simulate-slowdown", slow, "--autopilot")
t0 = time.monotonic()
run_fleet(*launch_args(4, data, out, *train, launch_opts=("--backend", "ring")), timeout=900)
rows = read_updates(out, 0).to_pylist()
steps = [r for r in rows if r["step"] >= 5]
tps = sum(r["update_tokens"] for r in steps) / sum(r["update_s"] for r in steps)
moves = [(e.step, e.data.get("to")) for e in read_events(out, 0) if e.kind == "rebalanced"]
print(json.dumps({"tree": str(root), "tok_s": round(tps), "moves": moves, "wall": round(time.monotonic() - t0)}))
