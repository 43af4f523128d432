#!/usr/bin/env python3
"""pgbench on the three scripts in turn, each on emptied tables: charges per
second, PostgreSQL's CPU per charge (every backend, from /proc, over the run
less its first 3 and last 2 seconds) and WAL records per charge.
    run.py CLIENTS SECONDS ROUNDS           (PGDATABASE: the database, default one_row)
    run.py --batch CLIENTS SECONDS ROUNDS   the *_batch.sql scripts: 8 charges per
        statement, on connections planned as idem's batch workers' are"""
import os, subprocess, sys, time, re
DB = os.environ.get("PGDATABASE", "one_row")
os.chdir(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
def pg_cpu():
    tot = 0
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            cmd = open(f'/proc/{p}/cmdline','rb').read().decode(errors='replace')
            if not cmd.startswith('postgres:'): continue
            f = open(f'/proc/{p}/stat').read().rsplit(')',1)[1].split()
            tot += int(f[11]) + int(f[12])
        except Exception: pass
    return tot / TICK
def wal():
    return float(subprocess.check_output(["psql","-h","127.0.0.1","-U","postgres",DB,"-Atc","select wal_records||' '||wal_bytes from pg_stat_wal"]).decode().split()[0])
MERCHANT = subprocess.check_output(["psql","-h","127.0.0.1","-U","postgres",DB,"-Atc","select id from merchants where name = 'bench'"]).decode().strip()
BATCH = "--batch" in sys.argv
args = [a for a in sys.argv[1:] if a != "--batch"]
ROWS = 8 if BATCH else 1
PLANNER = ("-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_bitmapscan=off"
           " -c enable_hashjoin=off -c enable_mergejoin=off -c jit=off")
sys.argv[1:] = args
clients = int(sys.argv[1]); dur = int(sys.argv[2]); rounds = int(sys.argv[3])
for r in range(rounds):
    for name in ['current', 'one_row', 'lean'] + (['subject'] if BATCH else []):
        subprocess.check_call(["psql","-h","127.0.0.1","-U","postgres",DB,"-qc","truncate idempotency_keys, charges, intents, intents_lean, intent_keys, intents_subject, outbox cascade; checkpoint"])
        p = subprocess.Popen(["pgbench","-n","-M","prepared","-j","2","-c",str(clients),"-T",str(dur),"-D",f"merchant={MERCHANT}","-f",f"{name}_batch.sql" if BATCH else f"{name}.sql","-P","1",DB],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PGHOST="127.0.0.1", PGUSER="postgres", **({"PGOPTIONS": PLANNER} if BATCH else {})))
        time.sleep(3)
        c0, w0, t0 = pg_cpu(), wal(), time.time()
        # count transactions via progress lines in stderr: simpler, compute from tps at end
        time.sleep(dur - 5)
        c1, w1, t1 = pg_cpu(), wal(), time.time()
        out, err = p.communicate()
        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
        n = ROWS * tps * (t1 - t0)
        print(f"round {r+1} {name:8s} clients {clients}: {ROWS * tps:7.0f} charges/s  PG CPU {1e6*(c1-c0)/n:6.0f} µs/charge  WAL rec {(w1-w0)/n:5.1f}/charge", flush=True)
