#!/usr/bin/env bash
# Instructions Redis runs for one GCRA script call (a decision and a lease), counted by
# callgrind on a redis-server of its own: the figure behind "Redis CPU", free of the machine's
# load. Each call is the crate's own script (`src/redis/prelude.lua` then `gcra.lua`, as the
# limiter sends it), on a key whose state the same calls keep writing: 1 000 decisions (all
# admitted), then 1 000 leases of 50 permits, each giving the one before back.
#
#   benches/redis_instructions.sh
#
# Needs valgrind, redis-server and Python's redis package (pip install redis).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${REDIS_PORT:-6393}
work=$(mktemp -d)
cat src/redis/prelude.lua src/redis/gcra.lua >"$work/gcra.lua"
valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
python3 - "$PORT" "$work" "$pid" <<'PY'
import glob, os, subprocess, sys
import redis
port, work, pid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
r = redis.Redis(port=port)
sha = r.script_load(open(f"{work}/gcra.lua").read())
# prelude.lua's arguments: the server's TIME, ticks per ms, cost 1; GCRA: interval 1 us, burst 500.
common = ["", 1000, 1]
gcra = [1, 500, 500]
def decide(i):
    return r.evalsha(sha, 1, "k", "d", *common, 0, 0, "", *gcra)
def lease(i):
    # A 20 ms lease of 50 permits, giving back the one before with 10 unused.
    return r.evalsha(sha, 1, "k", "l", *common, 20000, 0, "", *gcra, 50, i + 1, i, 10)
def count(call, expect):
    r.delete("k")
    for i in range(20):
        call(i)
    subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
    for i in range(20, 1020):
        reply = call(i)
        assert reply[0] == expect, reply
    subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
    dumps = sorted(glob.glob(f"{work}/cg.out.*"), key=os.path.getmtime)
    total = next(int(l.split()[1]) for l in open(dumps[-1]) if l.startswith("summary:"))
    return total / 1000
base = r.script_load("return 1")
def empty(i):
    r.evalsha(base, 1, "k")
    return [1]
print("| call | instructions in Redis |")
print("|---|---:|")
for name, call, expect in [
    ("`EVALSHA` of `return 1` (the floor)", empty, 1),
    ("GCRA decision (admitted)", decide, 1),
    ("GCRA lease of 50 (one given back)", lease, 4),
]:
    print(f"| {name} | {count(call, expect):,.0f} |".replace(",", " "))
PY
