#!/usr/bin/env bash
# Requests per second of a hello-world axum route over loopback, loaded by `wrk`, with no limiter,
# with RateLimitLayer, and with tower_governor; then the ratios the goals are stated in.
#
#   benches/http_wrk.sh                 # defaults: 3 rounds of 5 s per variant, 32 connections
#   ROUNDS=1 DURATION=10s benches/http_wrk.sh
#   SERVER_THREADS=2 VARIANTS="bulwark governor-headers" benches/http_wrk.sh
#   FEATURES=adaptive VARIANTS="none tower-shed overload" benches/http_wrk.sh  # `overload` needs it
#
# Needs `wrk` (Debian: apt-get install wrk). The server runs on one tokio worker thread pinned to
# CPU 0 and wrk on one thread pinned to CPU 1 (when `taskset` exists), so the two do not compete.
# With SERVER_THREADS=n the server runs n worker threads on CPUs 0 to n-1, and wrk n threads
# beside them (on the CPUs left, or on the last one where the machine has no more): every
# request from the one client address, so one hot key under n threads. The CPU per request is
# the server's own, whatever wrk shares with it.
# Variants are run in interleaved rounds; each one's median and its best round are reported, with
# the ratios of both (medians even out background load; best rounds sidestep the two-cluster
# spread some virtual machines show, see BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
CONNECTIONS=${CONNECTIONS:-32}
ADDR=${ADDR:-127.0.0.1:3917}
SERVER_THREADS=${SERVER_THREADS:-1}
# VARIANTS="none bulwark" runs only those (the ratios that need a missing variant are skipped).
read -r -a VARIANTS <<<"${VARIANTS:-none none-headers bulwark bulwark-bare governor governor-headers bulwark-refuse governor-refuse}"

# WRK=path and SERVER=path (a bench_server built before, as benches/scale.sh carries them to a
# machine without cargo) skip the build.
WRK=${WRK:-wrk}
command -v "$WRK" >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
if [[ -z "${SERVER:-}" ]]; then
  cargo build --release --example bench_server ${FEATURES:+--features "$FEATURES"} >&2
  SERVER=${CARGO_TARGET_DIR:-target}/release/examples/bench_server
fi

# `taskset -c CPUS` where it exists and works (a sandbox may refuse to pin); it execs its command, so `$!` is the server itself.
cpus=$(nproc)
server_cpus="0-$((SERVER_THREADS - 1))"
# wrk on the CPUs the server leaves, or on the last one where it leaves none.
if ((SERVER_THREADS < cpus - 1)); then wrk_cpus="$SERVER_THREADS-$((cpus - 1))"; else wrk_cpus=$((cpus - 1)); fi
if command -v taskset >/dev/null && taskset -c 0 true 2>/dev/null; then ON_CPU0=(taskset -c "$server_cpus"); ON_CPU1=(taskset -c "$wrk_cpus"); else ON_CPU0=(); ON_CPU1=(); fi

results=$(mktemp)
server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true; rm -f "$results"; }
trap cleanup EXIT

listening() { # whether something accepts connections on $ADDR (bash's /dev/tcp: no curl needed)
  (exec 3<>"/dev/tcp/${ADDR%:*}/${ADDR##*:}") 2>/dev/null
}

cpu_ticks() { # pid -> utime + stime of the process, in clock ticks
  awk '{print $14 + $15}' "/proc/$1/stat"
}

run_variant() { # variant -> sets RPS, NON2XX and CPU_US
  local variant=$1
  if listening; then
    echo "something already listens on $ADDR; set ADDR" >&2
    exit 1
  fi
  BENCH_THREADS=$SERVER_THREADS "${ON_CPU0[@]}" "$SERVER" "$variant" "$ADDR" >/dev/null &
  server_pid=$!
  for _ in $(seq 1 100); do
    listening && break
    sleep 0.05
  done
  # Warm up (and, for the refusal variants, spend the one permit).
  "${ON_CPU1[@]}" "$WRK" -t"$SERVER_THREADS" -c"$CONNECTIONS" -d1s "http://$ADDR/" >/dev/null
  local out cpu_before cpu_after
  cpu_before=$(cpu_ticks "$server_pid")
  out=$("${ON_CPU1[@]}" "$WRK" -t"$SERVER_THREADS" -c"$CONNECTIONS" -d"$DURATION" "http://$ADDR/")
  cpu_after=$(cpu_ticks "$server_pid")
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  local rps non2xx
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  RPS=$rps
  NON2XX=${non2xx:-0}
  local requests
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  # Server CPU time (user + system) per request, in microseconds.
  CPU_US=$(awk -v t=$((cpu_after - cpu_before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
}

for round in $(seq 1 "$ROUNDS"); do
  for variant in "${VARIANTS[@]}"; do
    run_variant "$variant"
    printf 'round %s  %-16s %10.0f req/s  %6s us CPU/request  (non-2xx: %s)\n' "$round" "$variant" "$RPS" "$CPU_US" "$NON2XX" >&2
    echo "$variant $RPS $CPU_US" >>"$results"
  done
done

median() { # variant column
  awk -v v="$1" -v c="$2" '$1 == v {print $c}' "$results" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'
}
best() { # variant column max|min: the variant's best round
  awk -v v="$1" -v c="$2" '$1 == v {print $c}' "$results" | sort -n | if [[ $3 == max ]]; then tail -n 1; else head -n 1; fi
}
ratio() { [[ -n "$1" && -n "$2" ]] && awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}' || printf "n/a"; }

ratios() { # names of two associative arrays: requests/s and CPU per request, by variant
  local -n r=$1 c=$2
  echo "  from requests/s:"
  echo "    bulwark / none                      $(ratio "${r[bulwark]:-}" "${r[none]:-}")   (goal >= 0.97)"
  echo "    bulwark-bare / none                 $(ratio "${r[bulwark-bare]:-}" "${r[none]:-}")"
  echo "    none-headers / none                 $(ratio "${r[none-headers]:-}" "${r[none]:-}")   (the cost of the header bytes alone)"
  echo "    bulwark / none-headers              $(ratio "${r[bulwark]:-}" "${r[none-headers]:-}")   (the same bytes on the wire)"
  echo "    bulwark / governor                  $(ratio "${r[bulwark]:-}" "${r[governor]:-}")   (goal >= 1.0)"
  echo "    bulwark / governor-headers          $(ratio "${r[bulwark]:-}" "${r[governor-headers]:-}")   (both add headers)"
  echo "    bulwark-bare / governor             $(ratio "${r[bulwark-bare]:-}" "${r[governor]:-}")   (neither adds headers)"
  echo "    bulwark-refuse / governor-refuse    $(ratio "${r[bulwark-refuse]:-}" "${r[governor-refuse]:-}")   (goal >= 1.0)"
  echo "  from server CPU per request (cost of the baseline / cost of ours):"
  echo "    none / bulwark                      $(ratio "${c[none]:-}" "${c[bulwark]:-}")"
  echo "    none / bulwark-bare                 $(ratio "${c[none]:-}" "${c[bulwark-bare]:-}")"
  echo "    none / none-headers                 $(ratio "${c[none]:-}" "${c[none-headers]:-}")"
  echo "    none-headers / bulwark              $(ratio "${c[none-headers]:-}" "${c[bulwark]:-}")"
  echo "    governor / bulwark                  $(ratio "${c[governor]:-}" "${c[bulwark]:-}")"
  echo "    governor-headers / bulwark          $(ratio "${c[governor-headers]:-}" "${c[bulwark]:-}")"
  echo "    governor / bulwark-bare             $(ratio "${c[governor]:-}" "${c[bulwark-bare]:-}")"
  echo "    governor-refuse / bulwark-refuse    $(ratio "${c[governor-refuse]:-}" "${c[bulwark-refuse]:-}")"
}

declare -A rps cpu best_rps best_cpu
echo
echo "$SERVER_THREADS server thread(s), wrk -t$SERVER_THREADS -c$CONNECTIONS -d$DURATION, $ROUNDS round(s): median, and best round"
for variant in "${VARIANTS[@]}"; do
  rps[$variant]=$(median "$variant" 2)
  cpu[$variant]=$(median "$variant" 3)
  best_rps[$variant]=$(best "$variant" 2 max)
  best_cpu[$variant]=$(best "$variant" 3 min)
  printf '  %-16s %10.0f req/s  %6.1f us server CPU per request   best: %10.0f req/s  %6.1f us\n' \
    "$variant" "${rps[$variant]}" "${cpu[$variant]}" "${best_rps[$variant]}" "${best_cpu[$variant]}"
done
echo
echo "ratios of the medians:"
ratios rps cpu
# Rounds of one variant fall into two clusters on some virtual machines (the CPUs busy, or halting
# and being woken); a median then depends on how many rounds landed in each. Each variant's best
# round is in the fast cluster whenever any of its rounds was.
echo
echo "ratios of the best rounds:"
ratios best_rps best_cpu
