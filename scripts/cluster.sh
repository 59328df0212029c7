#!/usr/bin/env bash
# scripts/cluster.sh — a local three-store hedgekv cluster.
#
#   scripts/cluster.sh start [--topology FILE|default] [--timeout SECONDS]
#   scripts/cluster.sh stop
#   scripts/cluster.sh status
#   scripts/cluster.sh kill N          # kill -9 store N
#   scripts/cluster.sh restart N       # start store N again with the same args
#   scripts/cluster.sh partition N     # needs the simulated network (--topology)
#   scripts/cluster.sh heal
#   scripts/cluster.sh endpoints       # print the cluster's gRPC endpoints
#   scripts/cluster.sh clean           # stop, then remove $CLUSTER_DIR
#
# Stores 1-3 listen on 127.0.0.1:GRPC_PORT_BASE+N (gRPC) and
# 127.0.0.1:STATUS_PORT_BASE+N (status HTTP: /metrics, /status), in zones
# dc-a, dc-b, dc-c. Each store's data, log and pid file live in $CLUSTER_DIR.
#
# Environment:
#   BIN               hedgekv binary              (default: <repo>/bin/hedgekv)
#   CLUSTER_DIR       data, logs, pid files        (default: <repo>/.cluster)
#   GRPC_PORT_BASE    store N gRPC port = base+N   (default: 20160)
#   STATUS_PORT_BASE  store N status port = base+N (default: 20180)
#   GRPC_PORTS        "p1,p2,p3": explicit gRPC ports, overrides the base
#   STATUS_PORTS      "p1,p2,p3": explicit status ports, overrides the base
#   FAULTS=1          start servers with --allow-faults
#   TICK              pass --tick TICK to the servers (e.g. 50ms)
#   START_TIMEOUT     seconds `start`/`restart` wait for leaders (default: 30)
#   STOP_TIMEOUT      seconds `stop` waits after SIGTERM before SIGKILL (default: 10)
#
# The ports a cluster was started with are remembered in
# $CLUSTER_DIR/cluster.conf, and each store's exact command line in
# $CLUSTER_DIR/storeN.args, so later commands (status, kill, restart, stop)
# act on that cluster whatever the environment says then.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

STORES=(1 2 3)
ZONES=(dc-a dc-b dc-c) # store N is in ZONES[N-1]

CLUSTER_DIR=${CLUSTER_DIR:-$ROOT/.cluster}
BIN=${BIN:-$ROOT/bin/hedgekv}
START_TIMEOUT=${START_TIMEOUT:-30}
STOP_TIMEOUT=${STOP_TIMEOUT:-10}
CTL_TIMEOUT=${CTL_TIMEOUT:-5}

GPORTS=()
SPORTS=()

# ---------------------------------------------------------------- helpers

say() { printf 'cluster: %s\n' "$*"; }
warn() { printf 'cluster: %s\n' "$*" >&2; }
die() {
	local code=$1
	shift
	printf 'cluster: %s\n' "$*" >&2
	exit "$code"
}

usage() {
	sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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

# Run the hedgekv binary with a time bound so a hung RPC cannot hang us.
hk() {
	if have timeout; then
		timeout -k 2 "$CTL_TIMEOUT" "$BIN" "$@"
	else
		"$BIN" "$@"
	fi
}

check_store_arg() {
	case ${1:-} in
	1 | 2 | 3) ;;
	"") die 2 "missing store id (1, 2 or 3)" ;;
	*) die 2 "bad store id '$1': want 1, 2 or 3" ;;
	esac
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
		for n in "${STORES[@]}"; do _out+=($((base + n))); done
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

ports_from_env() {
	parse_ports GPORTS "${GRPC_PORTS:-}" "${GRPC_PORT_BASE:-20160}"
	parse_ports SPORTS "${STATUS_PORTS:-}" "${STATUS_PORT_BASE:-20180}"
}

# Load the configuration the running (or last) cluster was started with;
# fall back to the environment when there is none.
load_conf() {
	local f key val line
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
		esac
	done <"$f"
}

save_conf() {
	local f
	f=$(conf_file)
	{
		printf 'GRPC_PORTS=%s\n' "$(
			IFS=,
			echo "${GPORTS[*]}"
		)"
		printf 'STATUS_PORTS=%s\n' "$(
			IFS=,
			echo "${SPORTS[*]}"
		)"
		printf 'BIN=%s\n' "$BIN"
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

peers_flag() {
	local n out=()
	for n in "${STORES[@]}"; do out+=("$n=$(grpc_addr "$n")"); done
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

server_args() {
	local n=$1
	SERVER_ARGS=(server
		--id "$n"
		--listen "$(grpc_addr "$n")"
		--status "$(status_addr "$n")"
		--peers "$(peers_flag)"
		--zone "$(zone_of "$n")"
		--data-dir "$(data_dir "$n")")
	if [[ -n ${TICK:-} ]]; then SERVER_ARGS+=(--tick "$TICK"); fi
	if [[ ${FAULTS:-0} == 1 ]]; then SERVER_ARGS+=(--allow-faults); fi
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

# wait_leaders TIMEOUT : until `ctl regions --json` shows at least one region
# and every region has a non-zero leader_store_id. Fails early if a store
# this cluster should be running dies.
wait_leaders() {
	local timeout=$1 deadline out last="no answer yet" regions leaders n
	deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		for n in "${EXPECT_UP[@]}"; do
			if ! store_pid "$n" >/dev/null; then
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

# ---------------------------------------------------------------- commands

cmd_start() {
	local topology="" timeout=$START_TIMEOUT n running=() p
	while (($#)); do
		case $1 in
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
	if [[ -n $topology ]]; then
		die 2 "start --topology $topology: the simulated network is not built yet (no 'hedgekv netsim'); start without --topology"
	fi

	check_bin
	mkdir -p "$CLUSTER_DIR"
	resolve_paths
	for n in "${STORES[@]}"; do
		if store_pid "$n" >/dev/null; then running+=("$n"); fi
	done
	if ((${#running[@]} > 0)); then
		# Act on the cluster that is already there, with its own ports.
		load_conf
		check_bin
		if ((${#running[@]} == ${#STORES[@]})); then
			say "cluster already running in $CLUSTER_DIR (endpoints $(endpoints))"
		else
			say "cluster partly running in $CLUSTER_DIR (stores ${running[*]} up); starting the others"
		fi
	else
		ports_from_env
		for p in "${GPORTS[@]}" "${SPORTS[@]}"; do
			if port_in_use "$p"; then
				die 1 "port $p on 127.0.0.1 is already in use (another cluster? try 'scripts/cluster.sh stop', or set GRPC_PORT_BASE/STATUS_PORT_BASE)"
			fi
		done
		save_conf
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
	say "cluster up: endpoints $(endpoints)"
}

# stop_stores N... : SIGTERM the given stores, SIGKILL what is left after STOP_TIMEOUT.
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
	local n running=()
	if [[ ! -d $CLUSTER_DIR ]]; then
		say "cluster not running (no $CLUSTER_DIR)"
		return 0
	fi
	load_conf
	for n in "${STORES[@]}"; do
		if store_pid "$n" >/dev/null; then running+=("$n"); else rm -f "$(pid_file "$n")"; fi
	done
	if ((${#running[@]} == 0)); then
		say "cluster not running"
		return 0
	fi
	stop_stores "${running[@]}"
	for n in "${running[@]}"; do
		if store_pid "$n" >/dev/null; then die 1 "store $n is still running"; fi
	done
	say "stopped store(s) ${running[*]}"
}

cmd_status() {
	local n pid up=0 out
	load_conf
	for n in "${STORES[@]}"; do
		if pid=$(store_pid "$n"); then
			printf 'store %s  %-5s %-4s  grpc %s  status %s  pid %s\n' "$n" "$(zone_of "$n")" up "$(grpc_addr "$n")" "$(status_addr "$n")" "$pid"
			up=$((up + 1))
		else
			printf 'store %s  %-5s %-4s  grpc %s  status %s\n' "$n" "$(zone_of "$n")" down "$(grpc_addr "$n")" "$(status_addr "$n")"
		fi
	done
	if ((up > 0)); then
		echo
		if out=$(hk ctl stores --endpoints "$(endpoints)" 2>&1); then
			printf '%s\n' "$out"
		else
			printf 'ctl stores failed: %s\n' "$out"
		fi
	fi
	((up == ${#STORES[@]}))
}

cmd_kill() {
	local n=${1:-} pid i
	check_store_arg "$n"
	load_conf
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
	local n=${1:-} f i timeout=$START_TIMEOUT
	check_store_arg "$n"
	[[ -d $CLUSTER_DIR ]] || die 1 "no cluster in $CLUSTER_DIR (run 'scripts/cluster.sh start' first)"
	load_conf
	check_bin
	if store_pid "$n" >/dev/null; then
		say "store $n is running; stopping it first"
		stop_stores "$n"
	fi
	f=$(args_file "$n")
	if [[ -f $f ]]; then
		mapfile -d '' -t SERVER_ARGS <"$f"
	else
		server_args "$n"
	fi
	launch "$n" "${SERVER_ARGS[@]}"
	# Wait until it serves gRPC, then until every region has a leader again.
	for ((i = 0; i < timeout * 10; i++)); do
		port_in_use "${GPORTS[$n - 1]}" && break
		if ! store_pid "$n" >/dev/null; then
			log_tail "$n"
			die 1 "store $n exited right after restart"
		fi
		sleep 0.1
	done
	port_in_use "${GPORTS[$n - 1]}" || {
		log_tail "$n"
		die 1 "store $n does not listen on $(grpc_addr "$n") after ${timeout}s"
	}
	EXPECT_UP=("$n")
	wait_leaders "$timeout" || die 1 "store $n restarted but regions lack a leader"
}

no_netsim() {
	die 2 "$1: this cluster was not started with --topology, so there is no simulated network to cut (and the simulated network is not built yet)"
}

cmd_partition() {
	local n=${1:-}
	check_store_arg "$n"
	no_netsim "partition $n"
}

cmd_heal() {
	no_netsim "heal"
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
	stop) cmd_stop ;;
	status) cmd_status ;;
	kill) cmd_kill "$@" ;;
	restart) cmd_restart "$@" ;;
	partition) cmd_partition "$@" ;;
	heal) cmd_heal ;;
	endpoints) cmd_endpoints ;;
	clean) cmd_clean ;;
	-h | --help | help) usage ;;
	"")
		usage >&2
		exit 2
		;;
	*)
		usage >&2
		die 2 "unknown command '$cmd'"
		;;
	esac
}

main "$@"
