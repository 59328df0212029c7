#!/usr/bin/env bash
# scripts/demo.sh — `make demo`: hedgekv across three simulated data centers.
#
#  1. build hedgekv;
#  2. start three stores behind the simulated WAN (`scripts/cluster.sh start
#     --topology default`: dc-a, dc-b, dc-c, 14 ms one way, 300 Mbit/s), put
#     region 1's leader in dc-a and read from a client in dc-b: from the
#     remote leader, from the local follower (linearizable, ReadIndex), from
#     the local follower with bounded staleness, and, after restarting the
#     stores with follower read leases (FOLLOWER_LEASES=1, --follower-leases),
#     from the local follower under its read lease; each way is measured
#     (MEASURE_S seconds of YCSB point reads, `bench ycsb`) and a table
#     compares them with a verdict computed from the numbers: the lease wins
#     locally (no WAN round trip), ReadIndex pays the remote leader's WAN
#     round trip plus a hop (it wins only when the leader is busy: bench
#     hot-region), stale is local too; or, when the load average before
#     the measurements is above the core count or the lease row is not
#     clearly (2x) ahead of the remote leader, that the machine was too
#     busy to judge; then stop it;
#  3. run `bin/hedgekv bench follower-read-dc --quick` (TiDB 3.1's
#     follower-read experiment: it starts its own three-zone cluster in one
#     process, loads 2,000 rows of ~1 KB and scans them from dc-b) and print
#     its table (remote leader vs local follower vs stale vs beside the
#     leader) and where its report and plots are.
#
# Environment:
#   CLUSTER_DIR     where the demo cluster lives (default: a fresh temp dir,
#                   removed afterwards unless the demo failed or KEEP=1)
#   RESULTS         where the benchmark writes (default: results, i.e.
#                   results/follower-read-dc/ in the repository)
#   GRPC_PORT_BASE, STATUS_PORT_BASE, NETSIM_PORT_BASE, NETSIM_CONTROL, BIN
#                   as for scripts/cluster.sh
#   SKIP_BUILD=1    use the existing binary
#   MEASURE_S       seconds each way of reading is measured (default 3)
#   MEASURE_THREADS client threads measuring it (default 8)
#
# The cluster is always stopped on exit. The whole demo takes about a
# minute on two cores (the benchmark: under a minute of it).

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
cd "$ROOT"

export BIN=${BIN:-$ROOT/bin/hedgekv}
RESULTS=${RESULTS:-results}
KEEP=${KEEP:-0}

TEMP_DIR=""
if [[ -z ${CLUSTER_DIR:-} ]]; then
	TEMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hedgekv-demo.XXXXXX")
	CLUSTER_DIR=$TEMP_DIR
fi
export CLUSTER_DIR

CLUSTER=("$SCRIPT_DIR/cluster.sh")
DEMO_START=$SECONDS
ok=0
cluster_up=0

if [[ -t 1 ]]; then
	banner() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
	banner() { printf '\n== %s\n' "$*"; }
fi

# cmdline CMD... : the command the way a user would type it.
cmdline() {
	local a out=()
	for a in "$@"; do
		if [[ $a == "$BIN" ]]; then
			a=bin/hedgekv
		elif [[ -z $a || $a =~ [^A-Za-z0-9_./:,=@%+-] ]]; then
			a="'${a//\'/\'\\\'\'}'"
		fi
		out+=("$a")
	done
	printf '$ %s\n' "${out[*]}"
}

# show CMD... : print the command line, then run it.
show() {
	cmdline "$@"
	"$@"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if ((cluster_up)); then
		banner "stopping the cluster"
		"${CLUSTER[@]}" stop || true
	fi
	if ((ok)) && [[ -n $TEMP_DIR && $KEEP != 1 ]]; then
		rm -rf -- "$TEMP_DIR"
	elif [[ -d $CLUSTER_DIR ]]; then
		echo "cluster data and logs kept in $CLUSTER_DIR"
	fi
	if ((rc != 0)); then
		echo "demo FAILED (exit $rc)" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
	banner "build"
	show go build -o "$BIN" ./cmd/hedgekv
fi

# busy PORT: something listens on 127.0.0.1:PORT.
busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Leave a cluster (or netsim) already running on the default ports alone.
if [[ -z ${GRPC_PORT_BASE:-}${STATUS_PORT_BASE:-}${GRPC_PORTS:-}${STATUS_PORTS:-} ]] && busy 20161; then
	echo "port 20161 is busy (a local cluster running?); the demo's stores use ports 21161-21163 and 21181-21183"
	export GRPC_PORT_BASE=21160 STATUS_PORT_BASE=21180
fi
if [[ -z ${NETSIM_PORT_BASE:-}${NETSIM_CONTROL:-} ]] && { busy 21999 || busy 21201; }; then
	echo "the netsim's default ports are busy; the demo's netsim uses 23101-23303 and 23999"
	export NETSIM_PORT_BASE=23000 NETSIM_CONTROL=127.0.0.1:23999
fi

banner "three stores in three simulated data centers: dc-a, dc-b, dc-c (14 ms one way, 300 Mbit/s)"
cluster_up=1
echo '$ BALANCE=off scripts/cluster.sh start --topology default'
FOLLOWER_LEASES=0 BALANCE=off "${CLUSTER[@]}" start --topology default
EP=$("${CLUSTER[@]}" endpoints)
# The CLI reads the endpoints from the environment (whatever a
# HEDGEKV_ENDPOINTS of the caller's said), as start's export line shows.
echo "\$ export HEDGEKV_ENDPOINTS=$EP"
export HEDGEKV_ENDPOINTS=$EP
hk() { show "$BIN" "$@"; }

banner "write a few keys; put region 1's leader in dc-a (the balancer is off: it stays there)"
hk put user/ada "Ada Lovelace"
hk put user/alan "Alan Turing"
hk put user/barbara "Barbara Liskov"
hk ctl transfer-leader 1 1
hk ctl regions

banner "a client in dc-b reads: remote leader, local follower (ReadIndex), local follower with bounded staleness"
echo "# the leader in dc-a serves: the request and the answer cross the WAN"
hk --zone dc-b get user/ada -v
echo "# dc-b's own store serves, linearizably, after a ReadIndex round trip to the leader in dc-a:"
echo "# the same WAN round trip as reading from the leader, plus the hop to the local store"
hk --zone dc-b get user/ada --read closest -v
echo "# dc-b's own store serves from its own state, at most 5 s stale: nothing crosses the WAN"
hk --zone dc-b get user/ada --read closest --max-staleness 5s -v
hk --zone dc-b scan user/ user0 --read closest

# Each row of the comparison: MEASURE_S s of YCSB workload C (point reads of
# ~1 KB rows) from MEASURE_THREADS client threads in dc-b, through bench ycsb
# against this cluster; go-ycsb's own output goes to a log in $CLUSTER_DIR.
MEASURE_S=${MEASURE_S:-3}
MEASURE_THREADS=${MEASURE_THREADS:-8}
MEASURE_RECORDS=200
STATUS_ADDRS=$(sed -n 's/^STATUS_PORTS=//p' "$CLUSTER_DIR/cluster.conf")
ROWS=()

# reads_by_mode : "STORE MODE COUNT" for stores 1 and 2 (hedgekv_server_reads_total).
reads_by_mode() {
	local n=0 port
	for port in ${STATUS_ADDRS//,/ }; do
		n=$((n + 1))
		((n <= 2)) || break
		curl -s --max-time 5 "http://127.0.0.1:$port/metrics" |
			awk -v s="$n" '/^hedgekv_server_reads_total\{/ { match($0, /mode="[^"]*"/); print s, substr($0, RSTART + 6, RLENGTH - 7), $NF }' || true
	done
}

# served_by BEFORE AFTER : the store and mode that served most of the reads
# between the two counts, and its share: "store 2 read-index 100%".
served_by() {
	awk 'NR == FNR { b[$1 " " $2] = $3; next } { d = $3 - b[$1 " " $2]; n[$1 " " $2] = d; t += d }
		END { for (k in n) if (n[k] > best) { best = n[k]; who = k }
		      if (t > 0) { split(who, w, " "); printf "store %s %s %.0f%%\n", w[1], w[2], 100 * best / t } else print "?" }' \
		<(printf '%s\n' "$1") <(printf '%s\n' "$2")
}

# measure LABEL BENCH-ARGS... : one row of the comparison.
measure() {
	local label=$1 before after dir=$CLUSTER_DIR/ycsb-${#ROWS[@]}
	shift
	local cmd=("$BIN" --zone dc-b bench ycsb --workload c --records "$MEASURE_RECORDS" --threads "$MEASURE_THREADS"
		--ops 10000000 --duration "${MEASURE_S}s" --progress -1s --fresh --out "$dir" "$@")
	cmdline "${cmd[@]}"
	before=$(reads_by_mode)
	if ! "${cmd[@]}" >"$dir.log" 2>&1; then
		cat "$dir.log" >&2
		return 1
	fi
	after=$(reads_by_mode)
	ROWS+=("$label|$(served_by "$before" "$after")|$(jq -r '.rows[0] | "\(.qps)|\(.p50_ms)|\(.p99_ms)|\(.failed)"' "$dir/ycsb/results.json")")
}

banner "measured from dc-b: ${MEASURE_S} s of point reads (YCSB C, ~1 KB rows, $MEASURE_THREADS threads) per row"
read -r LOAD_BEFORE _ </proc/loadavg
measure "remote leader (dc-a)" --read leader
measure "local follower, ReadIndex" --read closest --load=false
measure "local follower, stale <= 5s" --read closest --max-staleness 5s --load=false

banner "restart the stores with follower read leases on (every store must agree on --follower-leases)"
# With leases on, a follower holding one answers every follower read from
# it (no client option asks for ReadIndex instead), so the ReadIndex row
# above ran first; the remote-leader row does not depend on them.
"${CLUSTER[@]}" stop
echo '$ FOLLOWER_LEASES=1 BALANCE=off scripts/cluster.sh start --topology default'
FOLLOWER_LEASES=1 BALANCE=off "${CLUSTER[@]}" start --topology default
hk ctl transfer-leader 1 1
# dc-b's store holds a lease once the leader has granted it one.
for _ in {1..40}; do
	if "$BIN" --zone dc-b get user/ada --read closest -v 2>&1 >/dev/null | grep -q 'via follower-lease'; then break; fi
	sleep 0.25
done
echo "# dc-b's own store serves, linearizably, from the read lease its leader granted: nothing crosses the WAN"
hk --zone dc-b get user/ada --read closest -v
measure "local follower, lease" --read closest --load=false
read -r LOAD_AFTER _ </proc/loadavg

banner "which wins, and why (measured above)"
printf '%s\n' "${ROWS[@]}" | awk -F'|' -v cores="$(nproc)" -v lb="$LOAD_BEFORE" -v la="$LOAD_AFTER" '
	{ label[NR] = $1; by[NR] = $2; qps[NR] = $3; p50[NR] = $4; p99[NR] = $5; failed[NR] = $6 }
	END {
		printf "%-28s %-28s %8s %7s %7s %6s %s\n", "row", "served by", "reads/s", "p50 ms", "p99 ms", "failed", "vs remote leader"
		for (i = 1; i <= NR; i++)
			printf "%-28s %-28s %8.0f %7.1f %7.1f %6d %.2fx\n", label[i], by[i], qps[i], p50[i], p99[i], failed[i], (qps[1] > 0 ? qps[i] / qps[1] : 0)
		# rows: 1 remote leader, 2 ReadIndex, 3 stale, 4 lease
		ri = qps[2] / qps[1]; st = qps[3] / qps[1]; fl = qps[4] / qps[1]
		# Only the load before counts: the demo itself (three stores, the
		# netsim links, eight readers) raises it while it measures.
		load = lb
		printf "load average %s before, %s after (the demo itself adds to it), on %d cores\n", lb, la, cores
		if (load > cores || fl < 2 || by[4] !~ /follower-lease/ || by[2] !~ /read-index/) {
			why = (load > cores) ? sprintf("load %.2f before the measurements, from other work, is above %d cores", load, cores) : \
			      (by[4] !~ /follower-lease/ || by[2] !~ /read-index/) ? "a row was not served the way it names" : \
			      sprintf("the lease row is only %.2fx the remote leader, not clearly faster", fl)
			printf "verdict: the machine was too busy to judge (%s); the numbers above are not a verdict.\n", why
			print  "expected: follower lease (local, no WAN round trip) well ahead of the remote leader; ReadIndex no better"
			print  "than it (the same WAN round trip plus a hop; it wins only when the leader is busy: bench hot-region);"
			print  "stale local, like the lease."
			exit
		}
		printf "verdict: follower lease: local, no WAN round trip: %.1fx the remote leader (p50 %.1f vs %.1f ms).\n", fl, p50[4], p50[1]
		printf "         ReadIndex: pays the WAN round trip plus a hop: %.2fx the remote leader; it wins only when the\n", ri
		print  "         leader is busy (see bin/hedgekv bench hot-region)."
		printf "         stale: local, bounded staleness (at most 5 s old): %.1fx the remote leader.\n", st
	}'

banner "the simulated WAN: every (zone -> store) link, and the bytes that crossed it"
"${CLUSTER[@]}" status || true
"${CLUSTER[@]}" stop
cluster_up=0

banner "benchmark: TiDB 3.1's follower-read experiment, quick (its own three-zone cluster, in one process)"
show "$BIN" bench follower-read-dc --quick --out "$RESULTS"

banner "summary"
DIR=$RESULTS/follower-read-dc
echo "report: $DIR/report.md"
echo "plots:  $(find "$DIR" -maxdepth 1 -name '*.png' | sort | paste -sd' ' -)"
echo "full run (about nine minutes): bin/hedgekv bench follower-read-dc; the numbers of record are in docs/BENCHMARKS.md"
echo "demo finished in $((SECONDS - DEMO_START)) s"
ok=1
