#!/usr/bin/env bash
# scripts/demo.sh — `make demo`: hedgekv across three simulated data centers.
#
#  1. build hedgekv;
#  2. start three stores behind the simulated WAN (`scripts/cluster.sh start
#     --topology default`: dc-a, dc-b, dc-c, 14 ms one way, 300 Mbit/s), put
#     region 1's leader in dc-a and read from a client in dc-b three ways:
#     from the remote leader, from the local follower (linearizable), and
#     from the local follower with bounded staleness; then stop it;
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
BALANCE=off "${CLUSTER[@]}" start --topology default
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

banner "a client in dc-b reads: remote leader, local follower, local follower with bounded staleness"
echo "# the leader in dc-a serves: the request and the answer cross the WAN"
hk --zone dc-b get user/ada -v
echo "# dc-b's own store serves, linearizably: only a small ReadIndex round trip to dc-a crosses the WAN"
hk --zone dc-b get user/ada --read closest -v
echo "# dc-b's own store serves from its own state, at most 5 s stale: nothing crosses the WAN"
hk --zone dc-b get user/ada --read closest --max-staleness 5s -v
hk --zone dc-b scan user/ user0 --read closest

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
