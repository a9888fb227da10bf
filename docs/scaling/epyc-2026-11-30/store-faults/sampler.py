"""`python sampler.py OUT`: every 0.5 s, each Ray process's (and pgpong's) minor page faults and CPU ticks,
as lines "time pid name minflt ticks", until killed; run beside a bench (store-faults/ in docs/SCALING.md)."""
import os, time, sys
out = open(sys.argv[1], "w")
while True:
    t = time.time()
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline","rb").read().split(b"\0")[0].decode(errors="replace")
            if not cmd.startswith("ray::") and "pgpong" not in cmd: continue
            st = open(f"/proc/{pid}/stat").read().rsplit(")",1)[1].split()
            out.write(f"{t:.2f} {pid} {cmd[:40].replace(' ','_')} {st[7]} {int(st[11])+int(st[12])}\n")
        except Exception: pass
    out.flush(); time.sleep(0.5)
