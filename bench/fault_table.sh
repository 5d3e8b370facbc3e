#!/usr/bin/env bash
# Issue 17's fault table, one fault at a time, on local folders: signals mid-run (exit code,
# seconds to exit, masks vs manifest rows, the re-run), a full output disk (root only: a 400 KiB
# tmpfs), credentials in the config, two runs on one output, hostile list entries, a misspelt key.
# Usage: bench/fault_table.sh [work dir]   (maskray from .venv/bin, or MASKRAY=...)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
M=${MASKRAY:-$ROOT/.venv/bin/maskray}
PY=${PYTHON:-$ROOT/.venv/bin/python}
W=${1:-$(mktemp -d)}
rm -rf "$W/in" && mkdir -p "$W/in"
for i in $(seq 1 50); do for f in "$ROOT"/samples/*.jpg; do cp "$f" "$W/in/$i-$(basename "$f")"; done; done
echo "inputs: $(ls "$W/in" | wc -l) in $W"

rows() { "$PY" - "$1" <<'PY'
import glob, sys
import pyarrow.parquet as pq
parts = glob.glob(sys.argv[1] + "/_manifest/*/part-*.parquet")
print(f"rows {sum(pq.read_metadata(p).num_rows for p in parts)} in {len(parts)} parts")
PY
}
summary() { "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print('ok', s['ok'], 'skipped', s['skipped'], 'failed', s['failed'])" "$1/_summary.json"; }

for sig in TERM INT; do
  out=$W/out-$sig; rm -rf "$out"
  "$M" run --input "$W/in" --output "$out" --no-progress >/dev/null 2>"$W/$sig.err" & pid=$!
  while [ "$(ls "$out/masks" 2>/dev/null | wc -l)" -lt 20 ]; do sleep 0.2; done
  t0=$(date +%s.%N); kill -"$sig" $pid; wait $pid; rc=$?; t1=$(date +%s.%N)
  echo "SIG$sig: exit $rc after $(echo "$t1 - $t0" | bc) s; masks $(ls "$out/masks" | wc -l); $(rows "$out");" \
    "_interrupted.json $(ls "$out"/_manifest/*/_interrupted.json 2>/dev/null | wc -l); _summary.json $(ls "$out/_summary.json" 2>/dev/null | wc -l)"
  echo "  stderr: $(grep maskray: "$W/$sig.err" | head -1)"
  "$M" run --input "$W/in" --output "$out" --no-progress >/dev/null 2>&1; echo "  re-run: exit $? $(summary "$out")"
done

if [ "$(id -u)" = 0 ]; then
  mkdir -p "$W/full" && mount -t tmpfs -o size=400k tmpfs "$W/full"
  "$M" run --input "$W/in" --output "$W/full/out" --no-progress >/dev/null 2>"$W/full.err"; rc=$?
  echo "disk full (400 KiB tmpfs): exit $rc; masks $(ls "$W/full/out/masks" 2>/dev/null | wc -l); tracebacks $(grep -c Traceback "$W/full.err")"
  echo "  $(grep maskray: "$W/full.err" | tail -1)"
  umount "$W/full"
else
  echo "disk full: skipped (needs root for a tmpfs)"
fi

printf 'input: %s\noutput: %s\nstorage_options:\n  key: CANARYKEY123\n  secret: CANARYSECRET456\n' "$W/in" "$W/out-cred" >"$W/cred.yaml"
rm -rf "$W/out-cred"; "$M" run --config "$W/cred.yaml" --no-progress >"$W/cred.out" 2>&1; rc=$?
echo "credentials in the config: exit $rc; output files with the canary $(grep -rl CANARY "$W/out-cred" | wc -l); console lines $(grep -c CANARY "$W/cred.out")"

rm -rf "$W/out-two"
"$M" run --input "$W/in" --output "$W/out-two" --no-progress >/dev/null 2>&1 & p1=$!
sleep 3
"$M" run --input "$W/in" --output "$W/out-two" --no-progress >"$W/two.out" 2>&1; rc2=$?
wait $p1; echo "two runs on one output: first exit $?, second exit $rc2: $(grep maskray: "$W/two.out" | head -1)"

mkdir -p "$W/lists" && cp "$ROOT/samples/rocket.jpg" "$W/lists/rel.jpg"
printf 'rel.jpg\nhttp://127.0.0.1:9/x.jpg\nftp://example.com/a.jpg\n../../../../etc/passwd\n' >"$W/lists/list.txt"
rm -rf "$W/out-list"; "$M" run --input "$W/lists/list.txt" --output "$W/out-list" --no-progress >/dev/null 2>&1
echo "hostile list: exit $?"
"$PY" - "$W/out-list" <<'PY'
import glob, sys
import pyarrow.parquet as pq
for r in pq.read_table(glob.glob(sys.argv[1] + "/_manifest/*/part-*.parquet")).to_pylist():
    print("  ", r["source"], r["status"], r["error"])
PY

printf 'inptu: %s\noutput: %s\n' "$W/in" "$W/x" >"$W/typo.yaml"
echo "misspelt key: $("$M" run --config "$W/typo.yaml" 2>&1 | tail -1)"
