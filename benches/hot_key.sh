#!/usr/bin/env bash
# Redis CPU per admitted request on one hot key, with leases and without: four copies of
# `examples/hot_key.rs` (separate processes) share one Redis and one global quota, each loaded
# by its own `wrk` far above the quota. Redis's CPU is the sum of `usec` in `INFO commandstats`
# over the run; the admitted requests are what the instances count (their RESULT lines).
#
#   benches/hot_key.sh                       # QUOTA=5000, 8 s per mode
#   QUOTA=20000 DURATION=5 benches/hot_key.sh
#
# Needs `wrk` and `redis-server` (Debian: apt-get install wrk redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
QUOTA=${QUOTA:-5000}
DURATION=${DURATION:-8}
INSTANCES=${INSTANCES:-4}
REDIS_PORT=${REDIS_PORT:-6391}
for tool in wrk redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
cargo build --release --features redis --example hot_key >&2
BIN=${CARGO_TARGET_DIR:-target}/release/examples/hot_key
work=$(mktemp -d)
nice -n -10 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

printf '| leases | admitted | allowed (rate × time + burst) | used | Redis calls | Redis CPU per admitted | decided locally |\n'
printf '|---|---:|---:|---:|---:|---:|---:|\n'
for mode in on off; do
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
  pids=()
  for i in $(seq 0 $((INSTANCES - 1))); do
    ADDR=127.0.0.1:$((3004 + i)) REDIS_URL=redis://127.0.0.1:$REDIS_PORT QUOTA=$QUOTA LEASES=$mode \
      "$BIN" >"$work/instance$i.out" 2>&1 &
    pids+=($!)
  done
  for i in $(seq 0 $((INSTANCES - 1))); do
    for _ in $(seq 1 100); do grep -q "listening on" "$work/instance$i.out" && break; sleep 0.1; done
  done
  start=$(date +%s.%N)
  wrks=()
  for i in $(seq 0 $((INSTANCES - 1))); do
    wrk -t1 -c8 -d"${DURATION}s" "http://127.0.0.1:$((3004 + i))/" >"$work/wrk$i.out" 2>&1 &
    wrks+=($!)
  done
  wait "${wrks[@]}"
  end=$(date +%s.%N)
  redis-cli -p "$REDIS_PORT" info commandstats >"$work/stats"
  kill -TERM "${pids[@]}"
  wait "${pids[@]}" || true
  [[ -n "${VERBOSE:-}" ]] && grep -h RESULT "$work"/instance*.out >&2 && grep -E "^cmdstat" "$work/stats" >&2
  python3 - "$work" "$INSTANCES" "$QUOTA" "$start" "$end" "$mode" <<'PY'
import re, sys
work, instances, quota, start, end, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
totals = {"admitted": 0, "refused": 0, "local_decisions": 0, "leases": 0, "unused_permits": 0}
for i in range(instances):
    out = open(f"{work}/instance{i}.out").read()
    m = re.search(r"RESULT (.*)", out)
    if not m:
        sys.exit(f"instance {i} printed no RESULT:\n{out}")
    for field in m.group(1).split():
        k, v = field.split("=")
        totals[k] += int(v)
usec = calls = 0
for line in open(f"{work}/stats"):
    m = re.match(r"cmdstat_(\w+):calls=(\d+),usec=(\d+)", line)
    if m:
        calls += int(m.group(2)); usec += int(m.group(3))
elapsed = end - start
allowed = quota * elapsed + quota // 10
admitted = totals["admitted"]
local = totals["local_decisions"]
print(f"| {mode} | {admitted:,} | {allowed:,.0f} ({elapsed:.2f} s) | {100 * admitted / allowed:.1f} % | {calls:,} | "
      f"{usec / max(admitted, 1):.2f} µs | {100 * local / max(admitted, 1):.1f} % |".replace(",", " "))
if admitted > allowed:
    sys.exit(f"leases {mode}: {admitted} admitted where at most {allowed:.0f} are allowed")
PY
done
