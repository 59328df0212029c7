#!/usr/bin/env bash
# scripts/demo.sh — `make demo`: build hedgekv, start a local three-store
# cluster, use the CLI, kill a store and keep going, then run two YCSB
# workloads (C: point reads; scan: scans of up to 100 keys), each from the
# leader and from followers, and print a summary. The cluster is always
# stopped on exit.
#
# Environment:
#   CLUSTER_DIR     where the demo cluster lives (default: a fresh temp dir,
#                   removed afterwards unless the demo failed or KEEP=1)
#   GRPC_PORT_BASE, STATUS_PORT_BASE, GRPC_PORTS, STATUS_PORTS, BIN
#                   as for scripts/cluster.sh
#   RECORDS         YCSB records to load          (default 10000)
#   OPS             YCSB operations per workload  (default 20000)
#   SCAN_OPS        operations of the scan workload (default 2000)
#   The YCSB report is written to $CLUSTER_DIR/results/ycsb/.
#   THREADS         YCSB client threads           (default 16)
#   SKIP_BUILD=1    use the existing binary

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
cd "$ROOT"

export BIN=${BIN:-$ROOT/bin/hedgekv}
RECORDS=${RECORDS:-10000}
OPS=${OPS:-20000}
SCAN_OPS=${SCAN_OPS:-2000}
THREADS=${THREADS:-16}
KEEP=${KEEP:-0}

TEMP_DIR=""
if [[ -z ${CLUSTER_DIR:-} ]]; then
	TEMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hedgekv-demo.XXXXXX")
	CLUSTER_DIR=$TEMP_DIR
fi
export CLUSTER_DIR

CLUSTER=("$SCRIPT_DIR/cluster.sh")
DEMO_START=$SECONDS
SUMMARY=()
ok=0

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
	banner "stopping the cluster"
	"${CLUSTER[@]}" stop || true
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

# Leave a cluster already running on the default ports alone.
if [[ -z ${GRPC_PORTS:-}${GRPC_PORT_BASE:-}${STATUS_PORTS:-}${STATUS_PORT_BASE:-} ]] &&
	(exec 3<>/dev/tcp/127.0.0.1/20161) 2>/dev/null; then
	echo "port 20161 is busy (a local cluster running?); the demo uses ports 21161-21163 and 21181-21183"
	export GRPC_PORT_BASE=21160 STATUS_PORT_BASE=21180
fi

banner "start a three-store cluster (zones dc-a, dc-b, dc-c) in $CLUSTER_DIR"
"${CLUSTER[@]}" start
EP=$("${CLUSTER[@]}" endpoints)
# On the default ports the CLI needs no --endpoints; show it that way.
EPFLAG=(--endpoints "$EP")
if [[ $EP == "127.0.0.1:20161,127.0.0.1:20162,127.0.0.1:20163" ]]; then EPFLAG=(); fi
hk() { show "$BIN" "$@" "${EPFLAG[@]}"; }

banner "stores and regions"
hk ctl stores
hk ctl regions

banner "put, get, scan, delete"
hk put user/ada "Ada Lovelace"
hk put user/alan "Alan Turing"
hk put user/barbara "Barbara Liskov"
hk put user/edsger "Edsger Dijkstra"
hk get user/alan
hk get user/barbara --read follower -v
hk scan user/ user0
hk delete user/edsger
if hk get user/edsger; then
	echo "expected 'key not found' after delete" >&2
	exit 1
fi
hk scan user/ user0

banner "kill -9 the leader's store; the cluster keeps serving"
leader=$("$BIN" ctl regions --json --endpoints "$EP" | grep -oE '"leader_store_id"[[:space:]]*:[[:space:]]*[1-9]' | head -n 1 | grep -oE '[1-9]$' || true)
if [[ -n $leader ]]; then
	"${CLUSTER[@]}" kill "$leader"
	t0=$(date +%s%N)
	for ((i = 0; i < 100; i++)); do
		if "$BIN" put user/grace "Grace Hopper" --endpoints "$EP" >/dev/null 2>&1; then break; fi
		sleep 0.1
	done
	t1=$(date +%s%N)
	hk get user/grace
	echo "first write acknowledged $(((t1 - t0) / 1000000)) ms after the kill"
	SUMMARY+=("fail-over after kill -9 of store $leader: first write acked in $(((t1 - t0) / 1000000)) ms")
	"${CLUSTER[@]}" restart "$leader"
	hk get user/ada
else
	echo "could not find a leader in 'ctl regions --json'; skipping the kill" >&2
fi

# ycsb TITLE ARGS... : one `bench ycsb` run; its rows are merged into
# $RESULTS/ycsb/results.json and report.md.
RESULTS=$CLUSTER_DIR/results
ycsb() {
	local title=$1
	shift
	banner "YCSB: $title"
	show "$BIN" bench ycsb "$@" "${EPFLAG[@]}" --out "$RESULTS"
}

ycsb "load $RECORDS records, then workload C (100% reads) from the leader and from followers" \
	--workload c --read leader,follower --records "$RECORDS" --ops "$OPS" --threads "$THREADS" --fresh
ycsb "scans of up to 100 keys, from the leader and from followers" \
	--workload scan --load=false --read leader,follower --records "$RECORDS" --ops "$SCAN_OPS" --threads "$THREADS"

banner "cluster status"
"${CLUSTER[@]}" status || true

banner "summary"
for line in "${SUMMARY[@]}"; do printf '%s\n' "$line"; done
if [[ -f $RESULTS/ycsb/report.md ]]; then
	echo
	echo "YCSB ($RECORDS records, $THREADS threads; variant = read policy, param = workload):"
	sed -n '/^## Every row/,$p' "$RESULTS/ycsb/report.md" | tail -n +2
fi
echo "demo finished in $((SECONDS - DEMO_START)) s"
ok=1
