#!/usr/bin/env bash
# User-space instructions per request of the hello-world server of `benches/http_wrk.sh`, counted
# by valgrind's callgrind while `wrk` loads it over loopback. Unlike requests per second on a
# shared virtual machine, the count does not move with other load, so differences of a few
# percent between variants can be read from it.
#
#   benches/http_instructions.sh            # every variant, 5 s of load each
#   VARIANTS="none bulwark" DURATION=3s benches/http_instructions.sh
#   FEATURES=adaptive VARIANTS="none tower-shed overload" benches/http_instructions.sh
#
# FEATURES are the crate's features the server is built with (`overload` needs `adaptive`);
# they change the code of every variant a little, so compare variants of one run only.
#
# Needs `wrk` and `valgrind` (Debian: apt-get install wrk valgrind). The kernel's share of a
# request (the socket calls, the same for every variant: one read and one write per request)
# is not counted.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5s}
ADDR=${ADDR:-127.0.0.1:3919}
read -r -a VARIANTS <<<"${VARIANTS:-none identity-layer none-headers bulwark bulwark-bare governor governor-headers bulwark-three bulwark-cost-by bulwark-count-if bulwark-refuse governor-refuse}"

for tool in wrk valgrind; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (apt-get install $tool)" >&2; exit 1; }
done
cargo build --release --example bench_server ${FEATURES:+--features "$FEATURES"} >&2
SERVER=${CARGO_TARGET_DIR:-target}/release/examples/bench_server
# OUT_DIR=dir keeps each variant's callgrind profile there (for callgrind_annotate).
out_dir=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out_dir"
[[ -n "${OUT_DIR:-}" ]] || trap 'rm -rf "$out_dir"' EXIT

declare -A per_request
for variant in "${VARIANTS[@]}"; do
  # Instrumentation starts off and is turned on once the server answers, so start-up and the
  # readiness probe are left out. (Zeroing the counters with `callgrind_control --zero` instead
  # leaves profiles whose self costs `callgrind_annotate` puts all on one frame.)
  BENCH_THREADS=1 valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$out_dir/$variant.out" \
    "$SERVER" "$variant" "$ADDR" >/dev/null 2>"$out_dir/$variant.log" &
  server_pid=$!
  for _ in $(seq 1 200); do
    curl -s -o /dev/null "http://$ADDR/" && break
    sleep 0.1
  done
  callgrind_control --instr=on "$server_pid" >/dev/null 2>&1
  requests=$(wrk -t1 -c8 -d"$DURATION" "http://$ADDR/" | awk '/requests in/ {print $1}')
  kill -TERM "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  total=$(awk '/^summary:/ {print $2}' "$out_dir/$variant.out")
  per_request[$variant]=$(awk -v t="$total" -v n="$requests" 'BEGIN {printf "%.0f", t / n}')
  printf '%-16s %8s requests  %12s instructions per request\n' "$variant" "$requests" "${per_request[$variant]}"
done

ratio() { [[ -n "$1" && -n "$2" ]] && awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}' || printf "n/a"; }
echo
echo "instructions per request relative to none:"
for variant in "${VARIANTS[@]}"; do
  printf '  %-16s %s\n' "$variant" "$(ratio "${per_request[$variant]}" "${per_request[none]:-}")"
done
