#!/usr/bin/env bash
# Instructions per call of `benches/grpc.rs`'s calls (a gRPC call and an HTTP request through the
# same RateLimitLayer, in process, admitted and refused), counted by valgrind's callgrind: the
# whole call (request built, layer, response dropped) and the layer's answer to a refusal.
# Unlike wall time on a shared virtual machine, the counts do not move with other load.
#
#   benches/grpc_instructions.sh
#
# Needs `valgrind` (Debian: apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo bench --bench grpc --features grpc --no-run >&2 2>/dev/null
bench=$(cargo bench --bench grpc --features grpc --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "grpc" and m.get("executable"):
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '| call | whole call | the refusal'"'"'s answer |\n|---|---:|---:|\n'
for id in grpc/admitted/http grpc/admitted/grpc grpc/refused/http grpc/refused/grpc; do
  file="$out/${id//\//_}"
  (cd "$out" && valgrind --tool=callgrind --callgrind-out-file="$file" "$bench" --bench --profile-time 1 "^$id\$" >/dev/null 2>&1)
  callgrind_annotate --tree=caller --inclusive=yes "$file" >"$file.txt" 2>/dev/null
  # Inclusive instructions of a function over the calls its callers made of it.
  python3 - "$file.txt" "$id" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
def per_call(name):
    for i, line in enumerate(lines):
        if "*  " in line and name in line:
            total, calls, j = int(line.split()[0].replace(",", "")), 0, i - 1
            while j >= 0 and "<" in lines[j] and lines[j].strip()[:1].isdigit():
                m = re.search(r"\(([\d,]+)x\)", lines[j])
                calls += int(m.group(1).replace(",", "")) if m else 0
                j -= 1
            return total // calls if calls else None
    return None
whole = per_call("grpc::bench::{{closure}}::{{closure}}::{{closure}}")
answer = per_call("Refusal::respond")
print(f"| {sys.argv[2]} | {whole:,} | {'' if answer is None else f'{answer:,}'} |".replace(",", " "))
PY
done
