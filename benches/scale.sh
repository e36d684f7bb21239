#!/usr/bin/env bash
# The multi-core figures of issue 37 in one run, for a machine with many cores and no Rust
# toolchain (a lent one): checks per second by threads against governor (benches/contention.rs,
# alternating rounds), and whole requests at several server threads against tower_governor
# (benches/http_wrk.sh), and leased limiters on one hot key in Redis by quota (benches/leases.rs,
# with as many runtime threads as cores), each writing its output to $OUT (or ./scale-out).
#
#   benches/scale.sh prepare   # here: builds the binaries and copies them, with wrk and the
#                              # libraries it loads, into .scale/ (ignored by git; carry it)
#   benches/scale.sh run       # there: runs them (about 5 minutes on 16 cores, estimated)
#
# THREADS (default 1,2,4,8,16, up to the cores there), SERVER_THREADS_LIST (default "1 8"),
# ROUNDS and DURATION (http_wrk.sh's; here 2 rounds of 5 s) pick what runs.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRIED=.scale

prepare() {
  local target=${CARGO_TARGET_DIR:-target}
  cargo bench --bench contention --no-run >&2
  cargo build --release --example bench_server >&2
  cargo bench --features redis --bench leases --no-run >&2
  rm -rf "$CARRIED" && mkdir -p "$CARRIED/lib"
  # The bench binary is the newest contention-<hash> executable cargo left.
  local bench
  bench=$(find "$target/release/deps" -maxdepth 1 -type f -executable -name 'contention-*' -printf '%T@ %p\n' |
    sort -n | tail -n 1 | cut -d' ' -f2)
  cp "$bench" "$CARRIED/contention"
  bench=$(find "$target/release/deps" -maxdepth 1 -type f -executable -name 'leases-*' -printf '%T@ %p\n' |
    sort -n | tail -n 1 | cut -d' ' -f2)
  cp "$bench" "$CARRIED/leases"
  mkdir -p "$CARRIED/bin"
  cp "$(command -v redis-server)" "$CARRIED/bin/redis-server"
  cp "$target/release/examples/bench_server" "$CARRIED/bench_server"
  cp "$(command -v wrk)" "$CARRIED/wrk"
  # wrk's own libraries, which a bare machine may lack (the C library it finds there).
  ldd "$(command -v wrk)" | awk '/=> \// {print $3}' | grep -E 'luajit|ssl|crypto' |
    xargs -r -I{} cp -L {} "$CARRIED/lib/"
  # redis-server's, likewise, but for the C library and its loader.
  ldd "$(command -v redis-server)" | awk '/=> \// {print $3}' | grep -vE '/lib(c|m)\.so' |
    xargs -r -I{} cp -L {} "$CARRIED/lib/"
  du -sh "$CARRIED" >&2
}

run() {
  local out=${OUT:-scale-out}
  mkdir -p "$out"
  local cores
  cores=$(nproc)
  {
    echo "machine: $(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), $cores cores"
    date -u
  } | tee "$out/machine.txt"
  local threads=${THREADS:-}
  if [[ -z "$threads" ]]; then
    threads=$(for n in 1 2 4 8 16; do ((n <= cores)) && echo "$n"; done | paste -sd,)
  fi
  PAIRED=${PAIRED:-15} THREADS=$threads "$CARRIED/contention" --bench contention_ 2>&1 |
    grep -E '^contention_' | tee "$out/contention.txt"
  # The carried libraries only where the machine's own do not resolve (theirs match its C
  # library; these were built against this one's, glibc 2.34 or later).
  local libs=""
  if ldd "$CARRIED/wrk" | grep -q 'not found'; then libs="$PWD/$CARRIED/lib"; fi
  local redis_libs=""
  if ldd "$CARRIED/bin/redis-server" | grep -q 'not found'; then redis_libs="$PWD/$CARRIED/lib"; fi
  PATH="$PWD/$CARRIED/bin:$PATH" LD_LIBRARY_PATH="$redis_libs" WORKERS=$cores SECS=${SECS:-3} \
    "$CARRIED/leases" 2>&1 | tee "$out/leases.txt"
  for server_threads in ${SERVER_THREADS_LIST:-1 8}; do
    ((server_threads < cores)) || continue
    ROUNDS=${ROUNDS:-2} LD_LIBRARY_PATH="$libs" SERVER="$CARRIED/bench_server" WRK="$CARRIED/wrk" \
      SERVER_THREADS=$server_threads VARIANTS="${VARIANTS:-none bulwark governor-headers bulwark-refuse governor-refuse}" \
      benches/http_wrk.sh 2>&1 | tee "$out/http_${server_threads}_threads.txt"
  done
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: benches/scale.sh prepare|run" >&2; exit 2 ;;
esac
