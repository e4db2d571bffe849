#!/bin/sh
# Memory of waiting work (SPEC §3.7 "Later"): the daemon's resident memory with N delayed jobs claimed and waiting,
# beside its anchor in the same run: N manifests waiting in the inbox behind a full daemon (maxActiveJobs = 1, held
# by a long job). Then the same daemon restarted over the N delayed jobs (recovery reads every manifest once).
#   Benchmarks/delayed/run.sh [N] [BINARIES]     (defaults: 100000, .build/release)
set -eu
N=${1:-100000}
BIN=$(realpath "${2:-.build/release}")
WORK=$(mktemp -d /tmp/opq-delayed.XXXXXX)
trap 'pkill -f "opqueued --spool $WORK" 2>/dev/null || true; rm -rf "$WORK"' EXIT

make_manifests() {  # $1 spool, $2 extra key ("" or delay)
    python3 - "$1" "$2" "$N" <<'PY'
import plistlib, sys, os
spool, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(spool + "/inbox", exist_ok=True)
for i in range(n):
    d = {"job": f"j{i}", "operations": [{"id": "a", "kind": "sleep", "seconds": 0.0}]}
    if kind == "delay": d["delaySeconds"] = 36000.0
    with open(f"{spool}/inbox/.j{i}", "wb") as f: plistlib.dump(d, f, fmt=plistlib.FMT_BINARY)
    os.rename(f"{spool}/inbox/.j{i}", f"{spool}/inbox/j{i}.plist")
if kind == "":
    plistlib.dump({"job": "blocker", "operations": [{"id": "a", "kind": "sleep", "seconds": 3600.0}]},
                  open(spool + "/inbox/0blocker.plist", "wb"))
PY
}

# Starts the daemon on $1 (config $2, may be empty), waits until the inbox is empty or $3 files remain and the
# resident memory is steady, prints VmRSS in MB.
measure() {
    if [ -n "$2" ]; then "$BIN/opqueued" --spool "$1" --config "$2" --log-target console 2>/dev/null &
    else "$BIN/opqueued" --spool "$1" --log-target console 2>/dev/null & fi
    pid=$!
    while [ "$(ls "$1/inbox" | wc -l)" -gt "$3" ]; do sleep 1; done
    sleep 10
    rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
    kill $pid; wait $pid 2>/dev/null || true
    echo $((rss / 1024))
}

make_manifests "$WORK/inbox-spool" ""
python3 -c "import plistlib; plistlib.dump({'maxActiveJobs': 1}, open('$WORK/one.plist', 'wb'))"
anchor=$(measure "$WORK/inbox-spool" "$WORK/one.plist" "$N")
make_manifests "$WORK/delayed-spool" delay
start=$(date +%s)
delayed=$(measure "$WORK/delayed-spool" "" 0)
took=$(( $(date +%s) - start - 10 ))
restarted=$(measure "$WORK/delayed-spool" "" 0)
echo "$N manifests waiting in the inbox (anchor): $anchor MB"
echo "$N delayed jobs claimed and waiting:       $delayed MB ($(echo "scale=2; $delayed / $anchor" | bc)x), claimed in ${took} s"
echo "after a restart over them:                 $restarted MB ($(echo "scale=2; $restarted / $anchor" | bc)x)"
