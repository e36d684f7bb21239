#!/usr/bin/env bash
# Leases under faults, under load: four copies of `examples/hot_key.rs` (leases on, fail mode
# closed) share one Redis that writes every change to its append-only file before answering,
# each flooded by its own `wrk`. A third of the way in, one instance is killed (SIGKILL) holding
# whatever it leased; two thirds in, Redis is killed and started again on the same file. The
# admitted requests (wrk's responses that were not 429) of all four together must stay within
# what the quota allows over the run.
#
#   benches/hot_key_faults.sh            # QUOTA=5000, DURATION=9
#   KILL=0 RESTART=0 benches/hot_key_faults.sh   # the same run without the faults
#
# Needs `wrk` and `redis-server`.
set -euo pipefail
cd "$(dirname "$0")/.."
QUOTA=${QUOTA:-5000}
DURATION=${DURATION:-9}
REDIS_PORT=${REDIS_PORT:-6392}
cargo build --release --features redis --example hot_key >&2
BIN=${CARGO_TARGET_DIR:-target}/release/examples/hot_key
work=$(mktemp -d)
start_redis() {
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$work" --save "" \
    --appendonly yes --appendfsync always >>"$work/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
start_redis
pids=()
trap 'kill -9 ${pids[*]:-} $redis_pid 2>/dev/null; rm -rf "$work"' EXIT
for i in 0 1 2 3; do
  ADDR=127.0.0.1:$((3104 + i)) REDIS_URL=redis://127.0.0.1:$REDIS_PORT QUOTA=$QUOTA FAIL_MODE=closed \
    "$BIN" >"$work/instance$i.out" 2>&1 &
  pids+=($!)
done
for i in 0 1 2 3; do
  for _ in $(seq 1 100); do grep -q "listening on" "$work/instance$i.out" && break; sleep 0.1; done
done
start=$(date +%s.%N)
wrks=()
for i in 0 1 2 3; do
  wrk -t1 -c8 -d"${DURATION}s" "http://127.0.0.1:$((3104 + i))/" >"$work/wrk$i.out" 2>&1 &
  wrks+=($!)
done
sleep "$(echo "$DURATION / 3" | bc -l)"
[[ "${KILL:-1}" == 1 ]] && kill -9 "${pids[0]}"
sleep "$(echo "$DURATION / 3" | bc -l)"
if [[ "${RESTART:-1}" == 1 ]]; then
  kill -9 "$redis_pid"
  wait "$redis_pid" 2>/dev/null || true
  start_redis
fi
wait "${wrks[@]}"
end=$(date +%s.%N)
python3 - "$work" "$QUOTA" "$start" "$end" <<'PY'
import re, sys
work, quota, start, end = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
admitted = 0
for i in range(4):
    out = open(f"{work}/wrk{i}.out").read()
    done = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    admitted += done - (int(non2xx.group(1)) if non2xx else 0)
elapsed = end - start
allowed = quota * elapsed + quota // 10
print(f"admitted {admitted} of {allowed:.0f} allowed over {elapsed:.2f} s "
      f"({100 * admitted / allowed:.1f} %), one instance killed at 1/3, Redis restarted at 2/3")
if admitted > allowed:
    sys.exit(f"over the quota: {admitted} > {allowed:.0f}")
PY
