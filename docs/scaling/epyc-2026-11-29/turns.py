"""`python turns.py DIR vA vB`: each version's runs in DIR (vX-N.json, from ab.sh) as efficiency, its median,
the fixed part (seconds per update less the lower bound), the driver's CPU and how busy the machine was."""
import glob, json, statistics, sys
d = sys.argv[1]
for v in sys.argv[2:]:
    effs, fixed, drv, busy = [], [], [], []
    for f in sorted(glob.glob(f"{d}/{v}-*.json"), key=lambda f: int(f.rsplit("-", 1)[1][:-5])):
        u = json.load(open(f))["updates"][0]
        effs.append(u["efficiency"]); fixed.append(1000 * (u["seconds_per_update"] - u["lower_bound_s"]))
        drv.append(u["driver_cpu_ms"]); busy.append(u["machine_busy"])
    print(f"{v}: n={len(effs)} eff " + ", ".join(f"{e:.3f}" for e in effs) + f" | median {statistics.median(effs):.3f} | fixed ms " + ", ".join(f"{x:.0f}" for x in fixed) + f" | driver ms {min(drv):.0f}-{max(drv):.0f} | busy {min(busy):.2f}-{max(busy):.2f}")
