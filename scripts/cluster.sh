#!/usr/bin/env bash
# scripts/cluster.sh — a local hedgekv cluster: three stores, and more on demand.
#
#   scripts/cluster.sh start [--topology FILE|default] [--tls] [--timeout SECONDS]
#   scripts/cluster.sh stop [N]        # stop the cluster (stores, then netsim), or
#                                      # store N alone, gracefully
#   scripts/cluster.sh status
#   scripts/cluster.sh kill N          # kill -9 store N
#   scripts/cluster.sh restart N       # stop store N gracefully if it runs, start it
#                                      # again with the same args, wait until /readyz
#   scripts/cluster.sh add N [--zone Z] [--grpc-port P] [--status-port P]
#                                      # start store N (not 1-3) and join it to the
#                                      # cluster; the balancers move replicas to it
#   scripts/cluster.sh remove N [--timeout SECONDS]
#                                      # move every replica off store N (ctl
#                                      # remove-store --wait), stop it, delete its data
#   scripts/cluster.sh partition N [--mode blackhole|disconnect]   # needs --topology
#   scripts/cluster.sh heal            # end every partition (needs --topology)
#   scripts/cluster.sh endpoints       # print the cluster's gRPC endpoints
#   scripts/cluster.sh clean           # stop, then remove $CLUSTER_DIR
#
# Stores 1-3 listen on 127.0.0.1:GRPC_PORT_BASE+N (gRPC) and
# 127.0.0.1:STATUS_PORT_BASE+N (status HTTP: /metrics, /status), in zones
# dc-a, dc-b, dc-c. Each store's data, log and pid file live in $CLUSTER_DIR.
#
# `add N` starts an extra store N with --join: by default on store 1's ports
# plus N-1 (20164 and 20184 for store 4) and in zone dc-a, dc-b or dc-c
# (N-1 mod 3). `remove N` (any store, 1-3 too) runs `ctl remove-store N
# --wait`: the balancers move its replicas and leaderships to the other
# stores, then it is stopped and its data deleted; a removed id is not
# reused. Every other command (stop, status, kill, restart, endpoints)
# covers the extra stores too. Neither works behind --topology, whose
# simulated network places stores 1, 2 and 3 only.
#
# The simulated WAN (docs/topology.md): `start --topology default` (or a
# topology FILE placing stores 1, 2 and 3) first runs `hedgekv netsim` in
# the background (netsim.log, netsim.pid in $CLUSTER_DIR), then each store in
# its topology zone, advertising the netsim proxy of every zone's link to it
# (--advertise-zone-addrs), so stores reach each other, and a client started
# with `--zone Z` reaches them, through zone Z's proxies:
#     bin/hedgekv --zone dc-b get KEY   # from dc-b: 28 ms round trip to dc-a/dc-c
# `start --tls` runs the stores with mutual TLS: `hedgekv certs` makes a CA
# and certificates in $CLUSTER_DIR/tls (kept across restarts), the stores
# get --tls-cert/--tls-key/--tls-ca, and the CLI needs the client's three
# flags, which start prints and writes to $CLUSTER_DIR/tls/flags:
#     bin/hedgekv $(cat .cluster/tls/flags) get KEY
# `partition N` cuts store N off from the other stores and from clients of
# other zones (its own listen address stays reachable); `heal` ends every
# partition; `status` shows the netsim too; `stop` stops the stores, then the
# netsim. Without --topology there is no netsim, and partition/heal say so.
#
# Environment:
#   BIN               hedgekv binary              (default: <repo>/bin/hedgekv)
#   CLUSTER_DIR       data, logs, pid files        (default: <repo>/.cluster)
#   GRPC_PORT_BASE    store N gRPC port = base+N   (default: 20160)
#   STATUS_PORT_BASE  store N status port = base+N (default: 20180)
#   GRPC_PORTS        "p1,p2,p3": explicit gRPC ports, overrides the base
#   STATUS_PORTS      "p1,p2,p3": explicit status ports, overrides the base
#   NETSIM_PORT_BASE  netsim --port-base: zone i's proxy to store s listens on
#                     base+100*i+s, its control API on base+999 (default:
#                     21000; 0: free proxy ports chosen by the netsim, read
#                     back from `netsim status`, control on 21999)
#   NETSIM_CONTROL    netsim control API address   (default: 127.0.0.1:base+999)
#   BALANCE=off       start servers with --balance-interval -1s: no store moves
#                     leaders or replicas, so a leader put somewhere with
#                     `bin/hedgekv ctl transfer-leader REGION STORE` stays there
#                     (BALANCE=DURATION, e.g. 1s, sets the interval; default 5s)
#   FAULTS=1          start servers with --allow-faults
#   FOLLOWER_LEASES=1 start servers with --follower-leases (followers serve
#                     linearizable reads locally from read leases)
#   ETCD_READ_MODE    pass --etcd-read-mode to the servers: who answers a
#                     linearizable etcd Range whose session names no mode
#                     (leader, follower or stale; default: leader)
#   TICK              pass --tick TICK to the servers (e.g. 50ms)
#   START_TIMEOUT     seconds `start`/`restart`/`add` wait for leaders (default: 30)
#   REMOVE_TIMEOUT    seconds `remove` waits for the replicas to move (default: 120)
#   STOP_TIMEOUT      seconds `stop` and `restart` wait after SIGTERM before SIGKILL
#                     (default: 15; a store hands over its leaderships and
#                     finishes its requests first, within about 11s)
#
# `start` prints `export HEDGEKV_ENDPOINTS=...` for the cluster it started
# (bin/hedgekv reads it when --endpoints is not given), and warns when the
# default ports (127.0.0.1:20161-20163) are held by something else, which
# bin/hedgekv without it would talk to.
#
# The ports (and topology) a cluster was started with are remembered in
# $CLUSTER_DIR/cluster.conf, each store's exact command line in
# $CLUSTER_DIR/storeN.args and the netsim's in netsim.args, so later commands
# (status, kill, restart, partition, heal, stop) act on that cluster whatever
# the environment says then.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

FOUNDERS=(1 2 3) # the stores that bootstrap the cluster (--peers)
STORES=(1 2 3)   # the cluster's stores: founders not removed, then extras
EXTRAS=()        # stores added with `add`, in order
REMOVED=()       # stores taken out with `remove` (ids never reused)
DEFAULT_ZONES=(dc-a dc-b dc-c)
ZONES=("${DEFAULT_ZONES[@]}") # store N is in ZONES[N-1] (the topology's, behind netsim)

CLUSTER_DIR=${CLUSTER_DIR:-$ROOT/.cluster}
BIN=${BIN:-$ROOT/bin/hedgekv}
START_TIMEOUT=${START_TIMEOUT:-30}
REMOVE_TIMEOUT=${REMOVE_TIMEOUT:-120}
STOP_TIMEOUT=${STOP_TIMEOUT:-15}
CTL_TIMEOUT=${CTL_TIMEOUT:-5}
NETSIM_TIMEOUT=${NETSIM_TIMEOUT:-15}

GPORTS=()
SPORTS=()
# The simulated network: TOPOLOGY is "" (none), "default" or a file's
# absolute path; NS_BASE and NS_CONTROL are netsim's --port-base and
# --control; ZADDRS[N-1] is store N's --advertise-zone-addrs.
TOPOLOGY=""
NS_BASE=21000
NS_CONTROL=127.0.0.1:21999
ZADDRS=()
BALANCE_FLAG="" # the servers' --balance-interval, from BALANCE (balance_flag)
TLS_ON=0        # 1: the stores run with mutual TLS (start --tls)

# ---------------------------------------------------------------- helpers

say() { printf 'cluster: %s\n' "$*"; }
warn() { printf 'cluster: %s\n' "$*" >&2; }
die() {
	local code=$1
	shift
	printf 'cluster: %s\n' "$*" >&2
	exit "$code"
}

# usage prints the comment block at the top of this file.
usage() {
	awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "${BASH_SOURCE[0]}"
}

# short_usage prints the commands' synopsis lines of that block, and where
# the rest is: what follows an error, which must not scroll away.
short_usage() {
	printf 'usage:\n'
	awk 'NR == 1 { next } /^#   scripts\/cluster\.sh / { sub(/^# ?/, ""); sub(/ *#.*/, ""); print; next } /^#/ { next } { exit }' "${BASH_SOURCE[0]}"
	printf "'scripts/cluster.sh help' says more\n"
}

abspath() {
	case $1 in
	/*) printf '%s\n' "$1" ;;
	*) printf '%s\n' "$PWD/$1" ;;
	esac
}

# Resolve BIN to an absolute path when it names a file (a bare name is left
# for PATH lookup), and CLUSTER_DIR always.
resolve_paths() {
	case $BIN in
	*/*) BIN=$(abspath "$BIN") ;;
	esac
	CLUSTER_DIR=$(abspath "$CLUSTER_DIR")
	# One spelling per directory: the pid check matches the --data-dir a
	# store was started with.
	if [[ -d $CLUSTER_DIR ]]; then
		CLUSTER_DIR=$(cd "$CLUSTER_DIR" && pwd -P)
	else
		while [[ $CLUSTER_DIR == */ && $CLUSTER_DIR != / ]]; do CLUSTER_DIR=${CLUSTER_DIR%/}; done
	fi
}

have() { command -v "$1" >/dev/null 2>&1; }

# Run the hedgekv binary with a time bound so a hung RPC cannot hang us;
# with TLS on, as the client whose certificate tls_dir holds.
hk() {
	local tls=()
	if ((TLS_ON)); then tls=($(client_tls_flags)); fi
	if have timeout; then
		timeout -k 2 "$CTL_TIMEOUT" "$BIN" "$@" "${tls[@]}"
	else
		"$BIN" "$@" "${tls[@]}"
	fi
}

tls_dir() { printf '%s/tls\n' "$CLUSTER_DIR"; }

# client_tls_flags: the CLI's TLS flags for this cluster (no spaces in
# CLUSTER_DIR, which resolve_paths does not promise, would be needed to
# word-split them; ensure_certs refuses such a directory).
client_tls_flags() {
	local d
	d=$(tls_dir)
	printf -- '--tls-cert %s --tls-key %s --tls-ca %s\n' "$d/client.pem" "$d/client-key.pem" "$d/ca.pem"
}

# ensure_certs: the CA and certificates in tls_dir, made once by `hedgekv
# certs` (no openssl needed) and kept, so restarted stores trust each other;
# tls_dir/flags holds the client's flags for the CLI.
ensure_certs() {
	local d
	d=$(tls_dir)
	[[ $d != *[[:space:]]* ]] || die 2 "--tls: CLUSTER_DIR '$CLUSTER_DIR' contains white space; pick another"
	if [[ ! -f $d/ca.pem ]]; then
		"$BIN" certs --dir "$d" --hosts 127.0.0.1,localhost >/dev/null || die 1 "--tls: could not make certificates in $d"
		say "made a CA and certificates in $d"
	fi
	client_tls_flags >"$d/flags"
}

# check_store_arg N : N is one of the cluster's stores (call after load_conf).
check_store_arg() {
	local n=${1:-}
	[[ -n $n ]] || die 2 "missing store id (one of ${STORES[*]})"
	is_member "$n" "${STORES[@]}" || die 2 "bad store id '$n': the cluster's stores are ${STORES[*]}"
}

# is_member X LIST... : X is one of LIST.
is_member() {
	local x=$1 y
	shift
	for y in "$@"; do [[ $x == "$y" ]] && return 0; done
	return 1
}

# compute_stores: STORES from the founders not removed, then the extras.
compute_stores() {
	local n
	STORES=()
	for n in "${FOUNDERS[@]}"; do
		is_member "$n" "${REMOVED[@]}" || STORES+=("$n")
	done
	STORES+=("${EXTRAS[@]}")
}

is_port() { [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 > 0 && 10#$1 < 65536)); }

# parse_ports NAME LIST BASE -> fills the array named NAME
parse_ports() {
	local -n _out=$1
	local list=$2 base=$3 p
	_out=()
	if [[ -n $list ]]; then
		IFS=, read -r -a _out <<<"$list"
		((${#_out[@]} == 3)) || die 2 "want three comma-separated ports, got '$list'"
	else
		is_port "$base" || die 2 "bad port base '$base'"
		local n
		for n in "${FOUNDERS[@]}"; do _out+=($((base + n))); done
	fi
	for p in "${_out[@]}"; do
		is_port "$p" || die 2 "bad port '$p' in '${list:-base $base}'"
	done
}

conf_file() { printf '%s/cluster.conf\n' "$CLUSTER_DIR"; }
pid_file() { printf '%s/store%s.pid\n' "$CLUSTER_DIR" "$1"; }
log_file() { printf '%s/store%s.log\n' "$CLUSTER_DIR" "$1"; }
args_file() { printf '%s/store%s.args\n' "$CLUSTER_DIR" "$1"; }
data_dir() { printf '%s/store%s\n' "$CLUSTER_DIR" "$1"; }
netsim_pid_file() { printf '%s/netsim.pid\n' "$CLUSTER_DIR"; }
netsim_log_file() { printf '%s/netsim.log\n' "$CLUSTER_DIR"; }
netsim_args_file() { printf '%s/netsim.args\n' "$CLUSTER_DIR"; }

# check_netsim_env: NS_BASE and NS_CONTROL are usable.
check_netsim_env() {
	if ! [[ $NS_BASE =~ ^[0-9]+$ ]] || ((10#$NS_BASE >= 65536)); then
		die 2 "bad NETSIM_PORT_BASE '$NS_BASE' (0 picks free ports)"
	fi
	if ! [[ $NS_CONTROL =~ ^[^:]+:([0-9]+)$ ]] || ! is_port "${BASH_REMATCH[1]}"; then
		die 2 "bad NETSIM_CONTROL '$NS_CONTROL': want HOST:PORT (e.g. 127.0.0.1:21999)"
	fi
}

ports_from_env() {
	parse_ports GPORTS "${GRPC_PORTS:-}" "${GRPC_PORT_BASE:-20160}"
	parse_ports SPORTS "${STATUS_PORTS:-}" "${STATUS_PORT_BASE:-20180}"
	TOPOLOGY=""
	NS_BASE=${NETSIM_PORT_BASE:-21000}
	# The control port moves with the base, so that one variable moves a
	# second cluster's netsim off the first's entirely.
	local control_port=21999
	if [[ $NS_BASE =~ ^[0-9]+$ ]] && ((10#$NS_BASE > 0)); then control_port=$((10#$NS_BASE + 999)); fi
	NS_CONTROL=${NETSIM_CONTROL:-127.0.0.1:$control_port}
	ZONES=("${DEFAULT_ZONES[@]}")
	TLS_ON=0
	EXTRAS=()
	REMOVED=()
	compute_stores
}

# Load the configuration the running (or last) cluster was started with;
# fall back to the environment when there is none.
load_conf() {
	local f key val line extras="" entries=()
	f=$(conf_file)
	ports_from_env
	[[ -f $f ]] || return 0
	while IFS= read -r line || [[ -n $line ]]; do
		[[ $line == *=* ]] || continue
		key=${line%%=*}
		val=${line#*=}
		case $key in
		GRPC_PORTS) parse_ports GPORTS "$val" 0 ;;
		STATUS_PORTS) parse_ports SPORTS "$val" 0 ;;
		BIN) BIN=$val ;;
		TOPOLOGY) TOPOLOGY=$val ;;
		NETSIM_PORT_BASE) NS_BASE=$val ;;
		NETSIM_CONTROL) NS_CONTROL=$val ;;
		TLS) if [[ $val == 1 ]]; then TLS_ON=1; fi ;;
		ZONES)
			IFS=, read -r -a ZONES <<<"$val"
			((${#ZONES[@]} == ${#FOUNDERS[@]})) || ZONES=("${DEFAULT_ZONES[@]}")
			;;
		EXTRA_STORES) extras=$val ;;
		REMOVED_STORES) [[ -z $val ]] || IFS=, read -r -a REMOVED <<<"$val" ;;
		esac
	done <"$f"
	# Extra stores: ID@GRPC_PORT@STATUS_PORT@ZONE;... (after ZONES, which
	# they extend).
	local e id gp sp z
	if [[ -n $extras ]]; then
		IFS=';' read -r -a entries <<<"$extras"
		for e in "${entries[@]}"; do
			IFS=@ read -r id gp sp z <<<"$e"
			[[ $id =~ ^[0-9]+$ ]] && is_port "$gp" && is_port "$sp" && [[ -n $z ]] || die 1 "bad EXTRA_STORES entry '$e' in $f"
			EXTRAS+=("$id")
			GPORTS[id - 1]=$gp
			SPORTS[id - 1]=$sp
			ZONES[id - 1]=$z
		done
	fi
	compute_stores
}

save_conf() {
	local f n extras=()
	f=$(conf_file)
	for n in "${EXTRAS[@]}"; do extras+=("$n@${GPORTS[n - 1]}@${SPORTS[n - 1]}@${ZONES[n - 1]}"); done
	{
		# The founders' ports and zones (indexes 0-2 of the arrays, which
		# the extras' entries make sparse beyond).
		printf 'GRPC_PORTS=%s,%s,%s\n' "${GPORTS[0]}" "${GPORTS[1]}" "${GPORTS[2]}"
		printf 'STATUS_PORTS=%s,%s,%s\n' "${SPORTS[0]}" "${SPORTS[1]}" "${SPORTS[2]}"
		printf 'BIN=%s\n' "$BIN"
		printf 'ZONES=%s,%s,%s\n' "${ZONES[0]}" "${ZONES[1]}" "${ZONES[2]}"
		printf 'EXTRA_STORES=%s\n' "$(
			IFS=';'
			echo "${extras[*]}"
		)"
		printf 'REMOVED_STORES=%s\n' "$(
			IFS=,
			echo "${REMOVED[*]}"
		)"
		if [[ -n $TOPOLOGY ]]; then
			printf 'TOPOLOGY=%s\n' "$TOPOLOGY"
			printf 'NETSIM_PORT_BASE=%s\n' "$NS_BASE"
			printf 'NETSIM_CONTROL=%s\n' "$NS_CONTROL"
		fi
		printf 'TLS=%s\n' "$TLS_ON"
	} >"$f.tmp"
	mv "$f.tmp" "$f"
}

grpc_addr() { printf '127.0.0.1:%s\n' "${GPORTS[$1 - 1]}"; }
status_addr() { printf '127.0.0.1:%s\n' "${SPORTS[$1 - 1]}"; }
zone_of() { printf '%s\n' "${ZONES[$1 - 1]}"; }

endpoints() {
	local n out=()
	for n in "${STORES[@]}"; do out+=("$(grpc_addr "$n")"); done
	(
		IFS=,
		echo "${out[*]}"
	)
}

# peers_flag: the founders' --peers (all three, removed or not: it names
# the cluster they bootstrapped; each store's data directory keeps the rest).
peers_flag() {
	local n out=()
	for n in "${FOUNDERS[@]}"; do out+=("$n=$(grpc_addr "$n")"); done
	(
		IFS=,
		echo "${out[*]}"
	)
}

# The pid of store N if it is alive (and really is store N), else fail.
store_pid() {
	local n=$1 f pid
	f=$(pid_file "$n")
	[[ -f $f ]] || return 1
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	# Guard against a recycled pid (and zombies, whose cmdline is empty).
	if [[ -d /proc/$pid ]]; then
		local cmd
		cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
		[[ $cmd == *"--data-dir $(data_dir "$n")"* ]] || return 1
	fi
	printf '%s\n' "$pid"
}

# launched_alive N: store N, just launched by this script, has not exited.
# Unlike store_pid it does not compare /proc/PID/cmdline: right after the
# fork, before the exec, that is still this script's, and a store that is
# starting fine would read as gone. (A pid recycled within the seconds
# since the launch is not a concern.) A zombie counts as exited.
launched_alive() {
	local f pid stat state
	f=$(pid_file "$1")
	[[ -f $f ]] || return 1
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	if [[ -r /proc/$pid/stat ]] && read -r stat <"/proc/$pid/stat" 2>/dev/null; then
		state=${stat##*) }
		[[ ${state%% *} != Z ]] || return 1
	fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

log_tail() {
	local n f
	for n in "${@:-${STORES[@]}}"; do
		f=$(log_file "$n")
		[[ -f $f ]] || continue
		printf -- '--- store %s log (last 20 lines of %s) ---\n' "$n" "$f" >&2
		tail -n 20 "$f" >&2 || true
	done
}

# count_matches REGEX TEXT -> number of matches of REGEX in TEXT
count_matches() {
	local c
	c=$(grep -oE -- "$1" <<<"$2" | wc -l || true)
	printf '%d\n' "$((c + 0))"
}

# server_args N : store N's command line: a founder bootstraps with
# --peers, an extra store joins through the other stores (--join).
server_args() {
	local n=$1 m join=()
	SERVER_ARGS=(server
		--id "$n"
		--listen "$(grpc_addr "$n")"
		--status "$(status_addr "$n")")
	if is_member "$n" "${FOUNDERS[@]}"; then
		SERVER_ARGS+=(--peers "$(peers_flag)")
	else
		for m in "${STORES[@]}"; do [[ $m == "$n" ]] || join+=("$(grpc_addr "$m")"); done
		SERVER_ARGS+=(--join "$(
			IFS=,
			echo "${join[*]}"
		)")
	fi
	SERVER_ARGS+=(--zone "$(zone_of "$n")"
		--data-dir "$(data_dir "$n")")
	if [[ -n $TOPOLOGY ]]; then
		[[ -n ${ZADDRS[$n - 1]:-} ]] || die 1 "internal: no netsim addresses for store $n"
		SERVER_ARGS+=(--advertise-zone-addrs "${ZADDRS[$n - 1]}")
	fi
	if [[ -n ${TICK:-} ]]; then SERVER_ARGS+=(--tick "$TICK"); fi
	if [[ ${FAULTS:-0} == 1 ]]; then SERVER_ARGS+=(--allow-faults); fi
	if [[ ${FOLLOWER_LEASES:-0} == 1 ]]; then SERVER_ARGS+=(--follower-leases); fi
	if [[ -n ${ETCD_READ_MODE:-} ]]; then SERVER_ARGS+=(--etcd-read-mode "$ETCD_READ_MODE"); fi
	if [[ -n $BALANCE_FLAG ]]; then SERVER_ARGS+=(--balance-interval "$BALANCE_FLAG"); fi
	if ((TLS_ON)); then
		local d
		d=$(tls_dir)
		SERVER_ARGS+=(--tls-cert "$d/node.pem" --tls-key "$d/node-key.pem" --tls-ca "$d/ca.pem")
	fi
}

# balance_flag: BALANCE=off|on|DURATION -> BALANCE_FLAG, the servers'
# --balance-interval ("" leaves the servers' default, 5s). A negative
# interval turns the balancer off: leaders and replicas stay where they are
# put (ctl transfer-leader), as the WAN scenarios need.
balance_flag() {
	local b=${BALANCE:-}
	case $b in
	"" | on) BALANCE_FLAG="" ;;
	off | 0 | false | no) BALANCE_FLAG=-1s ;;
	*)
		[[ $b =~ ^[0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h)$ && ! $b =~ ^0+(\.0+)?[a-z]+$ ]] ||
			die 2 "bad BALANCE '$b': want off, on, or an interval such as 1s or 500ms"
		BALANCE_FLAG=$b
		;;
	esac
}

# launch N ARGS... : start store N in the background with exactly ARGS.
launch() {
	local n=$1 log
	shift
	log=$(log_file "$n")
	mkdir -p "$(data_dir "$n")"
	printf '=== %s: %s %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$BIN" "$*" >>"$log"
	printf '%s\0' "$@" >"$(args_file "$n")"
	nohup "$BIN" "$@" >>"$log" 2>&1 </dev/null &
	echo $! >"$(pid_file "$n")"
	say "store $n started (pid $!, $(grpc_addr "$n"), status $(status_addr "$n"), zone $(zone_of "$n"), log $log)"
}

check_bin() {
	if [[ $BIN == */* ]]; then
		[[ -x $BIN ]] || die 1 "binary $BIN not found or not executable (run 'make build', or set BIN)"
	else
		have "$BIN" || die 1 "binary $BIN not found in PATH (run 'make build', or set BIN)"
	fi
}

# ---------------------------------------------------------------- netsim

# The pid of the netsim this cluster runs behind, if it is alive, else fail.
netsim_pid() {
	local f pid cmd
	f=$(netsim_pid_file)
	[[ -f $f ]] || return 1
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	if [[ -d /proc/$pid ]]; then
		cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
		[[ $cmd == *" netsim "*"--control $NS_CONTROL"* ]] || return 1
	fi
	printf '%s\n' "$pid"
}

upstream_flag() {
	local n out=()
	for n in "${FOUNDERS[@]}"; do out+=("$n=$(grpc_addr "$n")"); done
	(
		IFS=,
		echo "${out[*]}"
	)
}

netsim_log_tail() {
	local f
	f=$(netsim_log_file)
	[[ -f $f ]] || return 0
	printf -- '--- netsim log (last 20 lines of %s) ---\n' "$f" >&2
	tail -n 20 "$f" >&2 || true
}

# netsim_ctl ARGS... : a `hedgekv netsim` subcommand against this cluster's netsim.
netsim_ctl() { hk netsim "$@" --control "$NS_CONTROL"; }

# start_netsim: run `hedgekv netsim` in the background (with the args it was
# started with before, if any, so that its proxies keep their addresses),
# and wait until its control API answers.
start_netsim() {
	local log f i pid out size
	log=$(netsim_log_file)
	f=$(netsim_args_file)
	mkdir -p "$CLUSTER_DIR"
	if [[ -f $f ]]; then
		mapfile -d '' -t NETSIM_ARGS <"$f"
	else
		NETSIM_ARGS=(netsim --topology "$TOPOLOGY" --upstream "$(upstream_flag)"
			--port-base "$NS_BASE" --control "$NS_CONTROL")
		printf '%s\0' "${NETSIM_ARGS[@]}" >"$f"
	fi
	printf '=== %s: %s %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$BIN" "${NETSIM_ARGS[*]}" >>"$log"
	size=$(wc -c <"$log")
	nohup "$BIN" "${NETSIM_ARGS[@]}" >>"$log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$(netsim_pid_file)"
	for ((i = 0; i < NETSIM_TIMEOUT * 5; i++)); do
		# Not netsim_pid: right after the fork the child may not have
		# exec'd the binary yet.
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid" 2>/dev/null || true
			rm -f "$(netsim_pid_file)"
			netsim_log_tail
			out=$(tail -c +"$((size + 1))" "$log" | grep -v '^netsim: [0-9]* zones' | tail -n 1)
			out=${out#hedgekv: }
			case $out in
			*upstream* | *"topology:"*)
				die 1 "netsim did not start: $out (the topology must place this cluster's stores 1, 2 and 3, and only them, each in one zone)"
				;;
			esac
			die 1 "netsim did not start: ${out:-it exited} (log $log)"
		fi
		# Ours answers, not another one on the same control address.
		if out=$(netsim_ctl status --json 2>/dev/null) &&
			[[ $(tr -d ' \t\r\n' <<<"$out") == *"\"upstream\":\"$(grpc_addr 1)\""* ]]; then
			say "netsim started (pid $pid, topology $TOPOLOGY, control $NS_CONTROL, log $log)"
			return 0
		fi
		sleep 0.2
	done
	netsim_log_tail
	kill -TERM "$pid" 2>/dev/null || true
	rm -f "$(netsim_pid_file)"
	die 1 "netsim (pid $pid) did not answer on $NS_CONTROL within ${NETSIM_TIMEOUT}s; stopped it"
}

# ensure_netsim: the netsim of a cluster with a topology is running.
ensure_netsim() {
	if netsim_pid >/dev/null; then return 0; fi
	rm -f "$(netsim_pid_file)"
	if [[ -f $(netsim_args_file) && $NS_BASE == 0 ]]; then
		# Its proxies were on free ports: a new netsim would not get them
		# back, and the stores advertise the old ones.
		die 1 "the cluster's netsim is not running, and it ran with NETSIM_PORT_BASE=0 (free ports), so it cannot come back on the addresses the stores advertise: run 'scripts/cluster.sh stop', then 'start --topology $TOPOLOGY' again"
	fi
	start_netsim
}

# read_topology: ask the running netsim where each store sits and where
# each zone reaches it; fill ZONES (store N's zone) and ZADDRS (store N's
# --advertise-zone-addrs, one netsim proxy per zone). The addresses come
# from `netsim status --json`, not from the port scheme.
read_topology() {
	local json flat link n z s sz addr bad=() missing=()
	local -A zone_of_store=() addrs=()
	if ! json=$(netsim_ctl status --json 2>&1); then
		warn "netsim status: $json"
		return 1
	fi
	flat=$(tr -d ' \t\r\n' <<<"$json")
	while IFS= read -r link; do
		[[ $link =~ ^\"zone\":\"([^\"]*)\",\"store\":([0-9]+),\"store_zone\":\"([^\"]*)\",\"address\":\"([^\"]*)\"$ ]] || continue
		z=${BASH_REMATCH[1]} s=${BASH_REMATCH[2]} sz=${BASH_REMATCH[3]} addr=${BASH_REMATCH[4]}
		case $s in
		1 | 2 | 3) ;;
		*)
			bad+=("$s")
			continue
			;;
		esac
		zone_of_store[$s]=$sz
		addrs[$s]+="${addrs[$s]:+,}$z=$addr"
	done < <(grep -oE '"zone":"[^"]*","store":[0-9]+,"store_zone":"[^"]*","address":"[^"]*"' <<<"$flat" || true)
	for n in "${FOUNDERS[@]}"; do
		[[ -n ${zone_of_store[$n]:-} ]] || missing+=("$n")
	done
	if ((${#missing[@]} > 0)); then
		warn "topology $TOPOLOGY does not match this cluster: it puts store(s) ${missing[*]} in no zone (every one of stores 1, 2 and 3 needs one)"
		return 1
	fi
	if ((${#bad[@]} > 0)); then
		warn "topology $TOPOLOGY does not match this cluster: it places store(s) $(printf '%s\n' "${bad[@]}" | sort -un | paste -sd, -), but the cluster has only stores 1, 2 and 3"
		return 1
	fi
	ZONES=()
	ZADDRS=()
	for n in "${FOUNDERS[@]}"; do
		ZONES+=("${zone_of_store[$n]}")
		ZADDRS+=("${addrs[$n]}")
	done
}

# stop_netsim: SIGTERM the netsim, SIGKILL it after STOP_TIMEOUT.
stop_netsim() {
	local pid deadline
	pid=$(netsim_pid) || {
		rm -f "$(netsim_pid_file)"
		return 1
	}
	kill -TERM "$pid" 2>/dev/null || true
	deadline=$((SECONDS + STOP_TIMEOUT))
	while netsim_pid >/dev/null; do
		if ((SECONDS >= deadline)); then
			warn "netsim (pid $pid) did not exit ${STOP_TIMEOUT}s after SIGTERM; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.2
			break
		fi
		sleep 0.1
	done
	netsim_pid >/dev/null && die 1 "netsim (pid $pid) is still running"
	rm -f "$(netsim_pid_file)"
	return 0
}

# wait_zone_routes TIMEOUT : until every running store, asked at its own
# address, lists every store with its zone addresses, so each store dials
# its peers through its zone's netsim proxies (a store learns them from its
# peers' Status; until then raft traffic would bypass the simulated WAN).
wait_zone_routes() {
	local timeout=$1 deadline n out zoned last="no answer yet" pending
	deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		pending=()
		for n in "${STORES[@]}"; do
			store_pid "$n" >/dev/null || continue # killed on purpose, say
			if out=$(hk ctl stores --json --endpoints "$(grpc_addr "$n")" 2>&1); then
				zoned=$(count_matches '"zone_addresses"[[:space:]]*:' "$out")
				if ((zoned < ${#STORES[@]})); then
					pending+=("$n")
					last="store $n knows the zone addresses of $zoned store(s)"
				fi
			else
				pending+=("$n")
				last="store $n: $(printf '%s' "$out" | tail -n 1)"
			fi
		done
		if ((${#pending[@]} == 0)); then
			say "every store reaches its peers through the netsim"
			return 0
		fi
		sleep 0.3
	done
	warn "timed out after ${timeout}s waiting for the stores to learn each other's netsim addresses (last: $last)"
	return 1
}

# client_hint: how to reach the cluster from a zone.
client_hint() {
	local z=${ZONES[1]} ep=""
	if [[ $(endpoints) != "127.0.0.1:20161,127.0.0.1:20162,127.0.0.1:20163" ]]; then
		ep=" --endpoints $(endpoints)"
	fi
	say "a client in a zone reaches the stores through that zone's proxies, e.g. from $z:"
	say "  bin/hedgekv --zone $z$ep get KEY"
}

# wait_leaders TIMEOUT : until `ctl regions --json` shows at least one region
# and every region has a non-zero leader_store_id. Fails early if a store
# this cluster should be running dies.
wait_leaders() {
	local timeout=$1 deadline out last="no answer yet" regions leaders n
	deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		for n in "${EXPECT_UP[@]}"; do
			if ! launched_alive "$n"; then
				warn "store $n exited while waiting for region leaders"
				log_tail "$n"
				return 1
			fi
		done
		if out=$(hk ctl regions --json --endpoints "$(endpoints)" 2>&1); then
			# Regions are counted by their "epoch" object (peers have none).
			regions=$(count_matches '"epoch"[[:space:]]*:' "$out")
			leaders=$(count_matches '"leader_store_id"[[:space:]]*:[[:space:]]*[1-9]' "$out")
			if ((regions > 0 && leaders == regions)); then
				say "every region has a leader ($regions region(s))"
				return 0
			fi
			last="$regions region(s), $leaders with a leader"
		else
			last=$(printf '%s' "$out" | tail -n 1)
		fi
		sleep 0.3
	done
	warn "timed out after ${timeout}s waiting for every region to have a leader (last: $last)"
	log_tail
	return 1
}

# readyz N : print store N's /readyz answer (status line's code, then the
# body's one line); fails if the status port does not answer. Plain bash
# (/dev/tcp): no curl needed.
readyz() (
	local code line body=""
	exec 3<>"/dev/tcp/127.0.0.1/${SPORTS[$1 - 1]}" || exit 1
	printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
	IFS= read -r -t 2 line <&3 || exit 1
	code=$(printf '%s' "$line" | cut -d' ' -f2)
	while IFS= read -r -t 2 line <&3; do body=${line%$'\r'}; done
	printf '%s %s\n' "$code" "$body"
) 2>/dev/null

# wait_ready N TIMEOUT : until store N's /readyz answers 200: it has caught
# up (every region it hosts knows a leader and applied what it knows
# committed). A rolling restart must not stop the next store before.
wait_ready() {
	local n=$1 timeout=$2 deadline out last="no answer yet"
	deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		if out=$(readyz "$n"); then
			if [[ $out == "200 "* ]]; then
				say "store $n is ready"
				return 0
			fi
			last=${out#* }
		fi
		sleep 0.2
	done
	warn "timed out after ${timeout}s waiting for store $n's /readyz (last: $last)"
	return 1
}

# endpoints_hint prints the export line that points bin/hedgekv at this
# cluster, and warns when the default endpoints, which bin/hedgekv uses
# without it, are another process's.
endpoints_hint() {
	local eps p others=()
	eps=$(endpoints)
	printf 'export HEDGEKV_ENDPOINTS=%s\n' "$eps"
	for p in 20161 20162 20163; do
		if [[ ,$eps, != *,127.0.0.1:$p,* ]] && port_in_use "$p"; then others+=("127.0.0.1:$p"); fi
	done
	if ((${#others[@]} > 0)); then
		warn "the default endpoints are in use by something else (${others[*]}: another cluster?): bin/hedgekv talks to them unless HEDGEKV_ENDPOINTS or --endpoints says otherwise; run the export line above"
	fi
}

# no_args CMD ARGS... : CMD takes no argument; refuse any.
no_args() {
	local cmd=$1
	shift
	(($# == 0)) || die 2 "$cmd takes no argument (got '$*'; see 'scripts/cluster.sh help')"
}

# ---------------------------------------------------------------- commands

cmd_start() {
	local topology="" timeout=$START_TIMEOUT n running=() p tls=0 i env_bin=$BIN
	while (($#)); do
		case $1 in
		--tls)
			tls=1
			shift
			;;
		--topology)
			(($# >= 2)) || die 2 "--topology needs FILE or 'default'"
			topology=$2
			shift 2
			;;
		--topology=*)
			topology=${1#--topology=}
			shift
			;;
		--timeout)
			(($# >= 2)) || die 2 "--timeout needs seconds"
			timeout=$2
			shift 2
			;;
		*) die 2 "start: unknown argument '$1'" ;;
		esac
	done
	[[ $timeout =~ ^[0-9]+$ ]] || die 2 "bad timeout '$timeout'"
	case $topology in
	"" | default) ;;
	*)
		[[ -f $topology && -r $topology ]] || die 2 "--topology $topology: no such readable file (or say 'default')"
		topology=$(abspath "$topology")
		;;
	esac
	balance_flag

	check_bin
	mkdir -p "$CLUSTER_DIR"
	resolve_paths
	# Which stores the cluster in this directory has (extras included).
	if [[ -f $(conf_file) ]]; then load_conf; fi
	for n in "${STORES[@]}"; do
		if store_pid "$n" >/dev/null; then running+=("$n"); fi
	done
	if ((${#running[@]} > 0)); then
		# Act on the cluster that is already there, with its own ports.
		load_conf
		check_bin
		if [[ -n $topology && $topology != "$TOPOLOGY" ]]; then
			local now="without a simulated network"
			[[ -z $TOPOLOGY ]] || now="behind topology $TOPOLOGY"
			die 1 "a cluster is already running in $CLUSTER_DIR (stores ${running[*]}) $now; stop it first ('scripts/cluster.sh stop') to start it with --topology $topology"
		fi
		if ((tls && !TLS_ON)); then
			die 1 "a cluster is already running in $CLUSTER_DIR (stores ${running[*]}) without TLS; stop it first ('scripts/cluster.sh stop') to start it with --tls"
		fi
		if ((${#running[@]} == ${#STORES[@]})); then
			say "cluster already running in $CLUSTER_DIR (endpoints $(endpoints))"
			endpoints_hint
		else
			say "cluster partly running in $CLUSTER_DIR (stores ${running[*]} up); starting the others"
		fi
		if [[ -n $TOPOLOGY ]]; then
			ensure_netsim
			read_topology || die 1 "cannot start the other stores behind the netsim"
		fi
	else
		# A netsim left behind by an earlier cluster in this directory
		# (a failed start, say) goes first: its ports may not be ours.
		if [[ -f $(conf_file) ]] && grep -q '^TOPOLOGY=.' "$(conf_file)"; then
			load_conf
			if stop_netsim; then
				say "stopped the netsim left by the previous cluster in $CLUSTER_DIR"
			fi
		fi
		rm -f "$(netsim_pid_file)" "$(netsim_args_file)"
		# The stores added and removed before the cluster was stopped are
		# its members still (their data directories say so); the rest of
		# the configuration comes from the environment, as for a new one.
		local kept_extras=() kept_removed=() kept_ports=() e
		if [[ -f $(conf_file) ]]; then
			load_conf
			kept_removed=("${REMOVED[@]}")
			for e in "${EXTRAS[@]}"; do kept_extras+=("$e") kept_ports+=("${GPORTS[e - 1]}@${SPORTS[e - 1]}@${ZONES[e - 1]}"); done
		fi
		ports_from_env
		BIN=$env_bin # load_conf read the last cluster's
		REMOVED=("${kept_removed[@]}")
		for i in "${!kept_extras[@]}"; do
			e=${kept_extras[i]}
			EXTRAS+=("$e")
			IFS=@ read -r "GPORTS[e - 1]" "SPORTS[e - 1]" "ZONES[e - 1]" <<<"${kept_ports[i]}"
		done
		compute_stores
		if [[ -n $topology ]] && ((${#EXTRAS[@]} + ${#REMOVED[@]} > 0)); then
			die 2 "--topology places stores 1, 2 and 3 only, and this cluster's stores are ${STORES[*]} (added or removed with add/remove); 'scripts/cluster.sh clean' starts afresh"
		fi
		TOPOLOGY=$topology
		TLS_ON=$tls
		if ((TLS_ON)); then ensure_certs; fi
		local check=("${GPORTS[@]}" "${SPORTS[@]}")
		if [[ -n $TOPOLOGY ]]; then
			check_netsim_env
			check+=("${NS_CONTROL##*:}")
		fi
		for p in "${check[@]}"; do
			if port_in_use "$p"; then
				die 1 "port $p on 127.0.0.1 is already in use by another process, not by a store of the cluster in $CLUSTER_DIR (another cluster? stop that one, or start this one on other ports: GRPC_PORT_BASE=20260 STATUS_PORT_BASE=20280${TOPOLOGY:+ NETSIM_CONTROL=127.0.0.1:22999} scripts/cluster.sh start, then use the export line it prints)"
			fi
		done
		if [[ -z $TOPOLOGY ]]; then
			save_conf
		else
			# cluster.conf is written once the netsim's proxies are known.
			start_netsim
			if ! read_topology; then
				stop_netsim || true
				die 1 "start failed: the topology does not fit the cluster"
			fi
			save_conf # the topology's zones and proxies
		fi
	fi

	for n in "${STORES[@]}"; do
		if store_pid "$n" >/dev/null; then continue; fi
		server_args "$n"
		launch "$n" "${SERVER_ARGS[@]}"
	done
	EXPECT_UP=("${STORES[@]}")
	if ! wait_leaders "$timeout"; then
		die 1 "start failed; logs in $CLUSTER_DIR (stop it with 'scripts/cluster.sh stop')"
	fi
	if [[ -n $TOPOLOGY ]]; then
		wait_zone_routes "$timeout" || die 1 "start failed; logs in $CLUSTER_DIR (stop it with 'scripts/cluster.sh stop')"
	fi
	say "cluster up: endpoints $(endpoints)"
	endpoints_hint
	if [[ -n $TOPOLOGY ]]; then client_hint; fi
	if ((TLS_ON)); then
		say "mutual TLS is on: the CLI needs the client flags (also in $(tls_dir)/flags):"
		say "  bin/hedgekv $(client_tls_flags) get KEY"
	fi
}

# stop_stores N... : SIGTERM the given stores, SIGKILL what is left after
# STOP_TIMEOUT. On SIGTERM a store stops gracefully: it hands the regions it
# leads to other stores, refuses new requests and finishes those in flight.
stop_stores() {
	local n pid deadline left
	for n in "$@"; do
		if pid=$(store_pid "$n"); then
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	deadline=$((SECONDS + STOP_TIMEOUT))
	while :; do
		left=()
		for n in "$@"; do
			if store_pid "$n" >/dev/null; then left+=("$n"); fi
		done
		((${#left[@]} == 0)) && break
		if ((SECONDS >= deadline)); then
			for n in "${left[@]}"; do
				if pid=$(store_pid "$n"); then
					warn "store $n (pid $pid) did not exit ${STOP_TIMEOUT}s after SIGTERM; sending SIGKILL"
					kill -KILL "$pid" 2>/dev/null || true
				fi
			done
			sleep 0.2
			break
		fi
		sleep 0.1
	done
	for n in "$@"; do
		if ! store_pid "$n" >/dev/null; then rm -f "$(pid_file "$n")"; fi
	done
}

cmd_stop() {
	local n running=() stopped=()
	(($# <= 1)) || die 2 "stop takes at most one argument, a store id (got '$*')"
	if (($# == 1)); then
		cmd_stop_store "$1"
		return
	fi
	if [[ ! -d $CLUSTER_DIR ]]; then
		say "cluster not running (no $CLUSTER_DIR)"
		return 0
	fi
	load_conf
	for n in "${STORES[@]}"; do
		if store_pid "$n" >/dev/null; then running+=("$n"); else rm -f "$(pid_file "$n")"; fi
	done
	if ((${#running[@]} > 0)); then
		stop_stores "${running[@]}"
		for n in "${running[@]}"; do
			if store_pid "$n" >/dev/null; then die 1 "store $n is still running"; fi
		done
		stopped+=("store(s) ${running[*]}")
	fi
	# The netsim last: the stores' connections go through it until they stop.
	if [[ -n $TOPOLOGY ]] && stop_netsim; then stopped+=("the netsim"); fi
	if ((${#stopped[@]} == 0)); then
		say "cluster not running"
		return 0
	fi
	if ((${#stopped[@]} == 2)); then
		say "stopped ${stopped[0]} and ${stopped[1]}"
	else
		say "stopped ${stopped[0]}"
	fi
}

# cmd_stop_store N : stop store N alone, gracefully (SIGTERM, then SIGKILL
# after STOP_TIMEOUT); the rest of the cluster, and the netsim, keep running.
cmd_stop_store() {
	local n=$1
	[[ -d $CLUSTER_DIR ]] || die 1 "no cluster in $CLUSTER_DIR"
	load_conf
	check_store_arg "$n"
	if ! store_pid "$n" >/dev/null; then
		rm -f "$(pid_file "$n")"
		say "store $n is not running"
		return 0
	fi
	stop_stores "$n"
	if store_pid "$n" >/dev/null; then die 1 "store $n is still running"; fi
	say "stopped store $n ('scripts/cluster.sh restart $n' starts it again)"
}

cmd_status() {
	local n pid up=0 out ok=1
	load_conf
	for n in "${STORES[@]}"; do
		if pid=$(store_pid "$n"); then
			printf 'store %s  %-5s %-4s  grpc %s  status %s  pid %s\n' "$n" "$(zone_of "$n")" up "$(grpc_addr "$n")" "$(status_addr "$n")" "$pid"
			up=$((up + 1))
		else
			printf 'store %s  %-5s %-4s  grpc %s  status %s\n' "$n" "$(zone_of "$n")" down "$(grpc_addr "$n")" "$(status_addr "$n")"
		fi
	done
	((up == ${#STORES[@]})) || ok=0
	if [[ -n $TOPOLOGY ]]; then
		if pid=$(netsim_pid); then
			printf 'netsim   up    topology %s  control %s  pid %s\n' "$TOPOLOGY" "$NS_CONTROL" "$pid"
		else
			printf 'netsim   down  topology %s  control %s\n' "$TOPOLOGY" "$NS_CONTROL"
			ok=0
		fi
	fi
	if ((up > 0)); then
		echo
		local eps asked="" cut="" re
		eps=$(endpoints)
		if [[ -n $TOPOLOGY ]] && netsim_pid >/dev/null; then
			# During a partition each side sees the other down: ask a
			# store that is not cut off, and say which one answers.
			cut=$(netsim_ctl status --json 2>/dev/null | tr -d ' \t\r\n' | grep -oE '"partitioned":\[[0-9,]*\]' || true)
			if [[ $cut =~ [0-9] ]]; then
				for n in "${STORES[@]}"; do
					re="[[,]${n}[],]"
					[[ $cut =~ $re ]] && continue
					store_pid "$n" >/dev/null || continue
					asked=$n
					break
				done
			fi
		fi
		if [[ -n $asked ]]; then
			eps=$(grpc_addr "$asked")
			printf 'as store %s (not partitioned) sees them:\n' "$asked"
		fi
		# The stores' view of each other is refreshed about once a second:
		# right after a kill it still shows the store up. Wait (at most 3s)
		# until it agrees with the processes above, so the two tables do
		# not contradict each other.
		local down=() json i
		for n in "${STORES[@]}"; do store_pid "$n" >/dev/null || down+=("$n"); done
		# A removed store is stopped: wait for the view to say so too.
		for n in "${REMOVED[@]}"; do down+=("$n"); done
		if [[ -z $asked && ${#down[@]} -gt 0 ]]; then
			# Each store has its own view: wait for, and show, one store's.
			for n in "${STORES[@]}"; do
				store_pid "$n" >/dev/null || continue
				eps=$(grpc_addr "$n")
				break
			done
		fi
		for ((i = 0; i < 30 && ${#down[@]} > 0; i++)); do
			json=$(hk ctl stores --json --endpoints "$eps" 2>/dev/null | tr -d ' \t\r\n') || break
			local stale=0
			for n in "${down[@]}"; do
				(($(count_matches "\"id\":${n},[^}]*\"up\":true" "$json") == 0)) || stale=1
			done
			((stale == 0)) && break
			sleep 0.1
		done
		if out=$(hk ctl stores --endpoints "$eps" 2>&1); then
			printf '%s\n' "$out"
		else
			printf 'ctl stores failed: %s\n' "$out"
		fi
	fi
	if [[ -n $TOPOLOGY ]] && netsim_pid >/dev/null; then
		echo
		if out=$(netsim_ctl status 2>&1); then
			printf 'simulated network (topology %s):\n%s\n' "$TOPOLOGY" "$out"
		else
			printf 'netsim status failed: %s\n' "$out"
			ok=0
		fi
	fi
	((ok == 1))
}

cmd_kill() {
	local n=${1:-} pid i
	(($# <= 1)) || die 2 "kill takes one argument, a store id (got '$*')"
	load_conf
	check_store_arg "$n"
	if ! pid=$(store_pid "$n"); then
		rm -f "$(pid_file "$n")"
		say "store $n is not running"
		return 0
	fi
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		store_pid "$n" >/dev/null || break
		sleep 0.1
	done
	store_pid "$n" >/dev/null && die 1 "store $n (pid $pid) survived kill -9"
	rm -f "$(pid_file "$n")"
	say "store $n killed (kill -9 $pid)"
}

cmd_restart() {
	local n=${1:-} f timeout=$START_TIMEOUT
	(($# <= 1)) || die 2 "restart takes one argument, a store id (got '$*')"
	[[ -d $CLUSTER_DIR ]] || die 1 "no cluster in $CLUSTER_DIR (run 'scripts/cluster.sh start' first)"
	load_conf
	check_store_arg "$n"
	check_bin
	if [[ -n $TOPOLOGY ]]; then
		# The store's saved args name the netsim's proxies: bring it back too.
		ensure_netsim
	fi
	if store_pid "$n" >/dev/null; then
		say "store $n is running; stopping it first"
		stop_stores "$n"
	fi
	f=$(args_file "$n")
	if [[ -f $f ]]; then
		mapfile -d '' -t SERVER_ARGS <"$f"
	else
		if [[ -n $TOPOLOGY ]]; then
			read_topology || die 1 "cannot restart store $n behind the netsim"
		fi
		balance_flag
		server_args "$n"
	fi
	launch "$n" "${SERVER_ARGS[@]}"
	# Wait until it serves gRPC, then until every region has a leader again.
	wait_serving "$n" "$timeout" || die 1 "restart $n failed (log $(log_file "$n"))"
	EXPECT_UP=("$n")
	wait_leaders "$timeout" || die 1 "store $n restarted but regions lack a leader"
	wait_ready "$n" "$timeout" || die 1 "store $n restarted but is not ready"
	if [[ -n $TOPOLOGY ]]; then
		wait_zone_routes "$timeout" || die 1 "store $n restarted but the stores do not reach each other through the netsim"
	fi
}

# wait_serving N TIMEOUT : until store N, just launched, listens on its
# gRPC port; fails (with its log) if it exits first.
wait_serving() {
	local n=$1 timeout=$2 i
	for ((i = 0; i < timeout * 10; i++)); do
		port_in_use "${GPORTS[$n - 1]}" && return 0
		if ! launched_alive "$n"; then
			log_tail "$n"
			warn "store $n exited right after it was started"
			return 1
		fi
		sleep 0.1
	done
	log_tail "$n"
	warn "store $n does not listen on $(grpc_addr "$n") after ${timeout}s"
	return 1
}

# no_topology WHAT : add and remove change the set of stores, which the
# simulated network fixes at 1, 2 and 3.
no_topology() {
	[[ -z $TOPOLOGY ]] || die 2 "$1: this cluster runs behind the simulated network (topology $TOPOLOGY), which places stores 1, 2 and 3 only"
}

cmd_add() {
	local n=${1:-} zone="" gp="" sp="" timeout=$START_TIMEOUT m p running=()
	[[ -n $n ]] || die 2 "add: missing store id"
	shift
	while (($#)); do
		case $1 in
		--zone | --grpc-port | --status-port)
			(($# >= 2)) || die 2 "$1 needs a value"
			case $1 in
			--zone) zone=$2 ;;
			--grpc-port) gp=$2 ;;
			--status-port) sp=$2 ;;
			esac
			shift 2
			;;
		*) die 2 "add: unknown argument '$1'" ;;
		esac
	done
	[[ -d $CLUSTER_DIR ]] || die 1 "no cluster in $CLUSTER_DIR (run 'scripts/cluster.sh start' first)"
	load_conf
	check_bin
	no_topology "add $n"
	[[ $n =~ ^[1-9][0-9]*$ ]] && ((n <= 65535)) || die 2 "bad store id '$n': want a number from 4 to 65535"
	is_member "$n" "${REMOVED[@]}" && die 2 "store $n was removed from this cluster, and a removed store's id is not reused: add another id"
	is_member "$n" "${STORES[@]}" && die 2 "store $n is already one of the cluster's stores (${STORES[*]})"
	for m in "${STORES[@]}"; do
		if store_pid "$m" >/dev/null; then running+=("$m"); fi
	done
	((${#running[@]} > 0)) || die 1 "no store of the cluster in $CLUSTER_DIR is running (run 'scripts/cluster.sh start' first)"
	zone=${zone:-${DEFAULT_ZONES[(n - 1) % 3]}}
	[[ $zone =~ ^[A-Za-z0-9._-]+$ ]] || die 2 "bad zone '$zone': letters, digits, '.', '_' and '-' only"
	gp=${gp:-$((GPORTS[0] + n - 1))}
	sp=${sp:-$((SPORTS[0] + n - 1))}
	for p in "$gp" "$sp"; do
		is_port "$p" || die 2 "bad port '$p' for store $n"
		for m in "${STORES[@]}"; do
			if [[ $p == "${GPORTS[m - 1]}" || $p == "${SPORTS[m - 1]}" ]]; then
				die 2 "port $p for store $n is store $m's already: pass --grpc-port and --status-port"
			fi
		done
		if port_in_use "$p"; then
			die 1 "port $p on 127.0.0.1 is already in use: pass --grpc-port and --status-port"
		fi
	done
	[[ $gp != "$sp" ]] || die 2 "store $n: the gRPC and status ports must differ"
	[[ ! -e $(data_dir "$n") ]] || die 1 "$(data_dir "$n") exists (left by an earlier store $n?): remove it, or add another id"
	# Only the running stores are worth joining through.
	local all=("${STORES[@]}")
	STORES=("${running[@]}")
	GPORTS[n - 1]=$gp
	SPORTS[n - 1]=$sp
	ZONES[n - 1]=$zone
	balance_flag
	server_args "$n"
	STORES=("${all[@]}")
	EXTRAS+=("$n")
	compute_stores
	save_conf
	launch "$n" "${SERVER_ARGS[@]}"
	if ! wait_serving "$n" "$timeout"; then
		# Not a member after all: forget it, so stop and status do not
		# look for it.
		stop_stores "$n"
		local kept=() e
		for e in "${EXTRAS[@]}"; do [[ $e != "$n" ]] && kept+=("$e"); done
		EXTRAS=("${kept[@]}")
		compute_stores
		save_conf
		rm -rf -- "$(data_dir "$n")"
		die 1 "add $n failed (log $(log_file "$n"))"
	fi
	wait_ready "$n" "$timeout" || die 1 "store $n started but is not ready"
	say "store $n joined the cluster (stores ${STORES[*]}); the balancers move replicas to it ('bin/hedgekv ctl stores' shows its regions)"
}

cmd_remove() {
	local n=${1:-} timeout=$REMOVE_TIMEOUT m eps=() out e kept=()
	[[ -n $n ]] || die 2 "remove: missing store id"
	shift
	while (($#)); do
		case $1 in
		--timeout)
			(($# >= 2)) || die 2 "--timeout needs seconds"
			timeout=$2
			shift 2
			;;
		*) die 2 "remove: unknown argument '$1'" ;;
		esac
	done
	[[ $timeout =~ ^[1-9][0-9]*$ ]] || die 2 "bad timeout '$timeout'"
	[[ -d $CLUSTER_DIR ]] || die 1 "no cluster in $CLUSTER_DIR"
	load_conf
	check_bin
	no_topology "remove $n"
	check_store_arg "$n"
	for m in "${STORES[@]}"; do
		[[ $m != "$n" ]] && store_pid "$m" >/dev/null && eps+=("$(grpc_addr "$m")")
	done
	((${#eps[@]} > 0)) || die 1 "remove $n: no other store is running to take its replicas"
	say "removing store $n: its replicas and leaderships move to the other stores (at most ${timeout}s)"
	# ctl waits within its --timeout; hk's own bound must be longer.
	if ! out=$(CTL_TIMEOUT=$((timeout + 10)) hk ctl remove-store "$n" --wait --timeout "${timeout}s" --endpoints "$(
		IFS=,
		echo "${eps[*]}"
	)" 2>&1); then
		printf '%s\n' "$out" >&2
		if [[ $out != *"is being removed"* && $out != *"already being removed"* ]]; then
			die 1 "remove $n refused; nothing changed"
		fi
		die 1 "remove $n: its replicas did not all move within ${timeout}s; it is still marked removing and keeps running ('scripts/cluster.sh remove $n' again waits on)"
	fi
	printf '%s\n' "$out"
	if store_pid "$n" >/dev/null; then stop_stores "$n"; fi
	store_pid "$n" >/dev/null && die 1 "store $n is still running"
	rm -rf -- "$(data_dir "$n")"
	rm -f "$(pid_file "$n")" "$(args_file "$n")"
	for e in "${EXTRAS[@]}"; do [[ $e != "$n" ]] && kept+=("$e"); done
	EXTRAS=("${kept[@]}")
	REMOVED+=("$n")
	compute_stores
	save_conf
	say "store $n removed: stopped, its data deleted; the cluster's stores are ${STORES[*]}"
	# HEDGEKV_ENDPOINTS, if set from start's line, still names store $n.
	endpoints_hint
}

# need_netsim WHAT : the cluster runs behind a live netsim, or say plainly
# why WHAT cannot be done.
need_netsim() {
	load_conf
	if [[ -z $TOPOLOGY ]]; then
		die 2 "$1 needs the simulated network, and this cluster was not started with --topology (run 'scripts/cluster.sh stop', then 'scripts/cluster.sh start --topology default')"
	fi
	netsim_pid >/dev/null ||
		die 1 "$1: the cluster's netsim is not running (topology $TOPOLOGY, control $NS_CONTROL; 'scripts/cluster.sh restart N' or 'start' brings it back)"
}

cmd_partition() {
	local n=${1:-} out
	load_conf
	check_store_arg "$n"
	shift
	local extra=()
	while (($#)); do
		case $1 in
		--mode)
			(($# >= 2)) || die 2 "--mode needs blackhole or disconnect"
			extra+=(--mode "$2")
			shift 2
			;;
		--mode=*)
			extra+=("$1")
			shift
			;;
		*) die 2 "partition: unknown argument '$1'" ;;
		esac
	done
	need_netsim "partition $n"
	out=$(netsim_ctl partition "$n" "${extra[@]}" 2>&1) || die 1 "partition $n: ${out#hedgekv: }"
	say "store $n ($(zone_of "$n")) cut off from the other stores and from clients of other zones; its own address $(grpc_addr "$n") stays reachable ('scripts/cluster.sh heal' ends it)"
}

cmd_heal() {
	local out
	need_netsim "heal"
	out=$(netsim_ctl heal 2>&1) || die 1 "heal: ${out#hedgekv: }"
	say "every partition healed"
}

cmd_endpoints() {
	load_conf
	endpoints
}

cmd_clean() {
	cmd_stop
	if [[ -d $CLUSTER_DIR ]]; then
		rm -rf -- "$CLUSTER_DIR"
		say "removed $CLUSTER_DIR"
	fi
}

main() {
	local cmd=${1:-}
	(($#)) && shift
	resolve_paths
	EXPECT_UP=()
	case $cmd in
	start) cmd_start "$@" ;;
	stop) cmd_stop "$@" ;;
	status)
		no_args status "$@"
		cmd_status
		;;
	kill) cmd_kill "$@" ;;
	restart) cmd_restart "$@" ;;
	add) cmd_add "$@" ;;
	remove) cmd_remove "$@" ;;
	partition) cmd_partition "$@" ;;
	heal)
		(($# == 0)) || die 2 "heal takes no argument"
		cmd_heal
		;;
	endpoints)
		no_args endpoints "$@"
		cmd_endpoints
		;;
	clean)
		no_args clean "$@"
		cmd_clean
		;;
	-h | --help | help) usage ;;
	"")
		usage >&2
		exit 2
		;;
	*)
		warn "unknown command '$cmd'"
		short_usage >&2
		exit 2
		;;
	esac
}

main "$@"
