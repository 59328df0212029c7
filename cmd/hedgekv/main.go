// Command hedgekv is the single hedgekv binary: the store server, the
// key-value client commands, the operator's ctl commands and the
// benchmarks. It only parses flags and wires packages together.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client"
)

// Exit codes, one scheme for every command (hedgekv help lists it).
const (
	exitOK          = 0
	exitNotFound    = 1 // the answer is no: get of a missing key, ctl status of a cluster that is not healthy
	exitUsage       = 2 // the command line or its input is wrong
	exitUnreachable = 3 // no store could be reached at the endpoints
	exitFailure     = 4 // the stores were reached and the request failed (refused, timed out)
)

// exitCodesHelp is the scheme as the help shows it.
const exitCodesHelp = `Exit status: 0 success; 1 the answer is no (get: key not found; ctl status:
not healthy); 2 usage or bad input (a wrong flag or argument, an empty key, a
key or value over the stores' limit); 3 no store could be reached at the
endpoints; 4 the request failed (the stores answered with an error, or
--timeout ran out).`

const defaultEndpoints = "127.0.0.1:20161,127.0.0.1:20162,127.0.0.1:20163"

// endpointsEnv names the variable that sets the endpoints when
// --endpoints is not given (as ETCDCTL_ENDPOINTS does for etcdctl).
const endpointsEnv = "HEDGEKV_ENDPOINTS"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runWithStdin(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app holds the root's flags and the output streams, shared by every
// command.
type app struct {
	stdin          io.Reader // put KEY - reads the value from it
	stdout, stderr io.Writer
	endpoints      string
	zone           string
	timeout        time.Duration
	cpuProfile     string
	stopProfile    func()
	// tlsCert, tlsKey and tlsCA are --tls-cert, --tls-key and --tls-ca:
	// the client's identity, or the server's (server command).
	tlsCert, tlsKey, tlsCA string
	// getenv reads the environment (HEDGEKV_<FLAG>, flagenv.go); tests
	// replace it.
	getenv func(string) string
	// root is the command tree run parses into.
	root *cobra.Command
	// flagEnv names, per flag name, the variable that set its default;
	// flagEnvErrs holds the variables whose value the flag refused,
	// reported unless the flag is given (flagenv.go).
	flagEnv     map[string]string
	flagEnvErrs map[string]error
	// clientLog holds what the client library logged (warnings: a store
	// that did not answer, a list that could not be loaded). A command
	// that succeeded got around whatever it was, so it stays quiet; a
	// command that fails adds it to its one error line.
	clientLog logBuffer
}

// appKey is the context key of the app a command runs in, for the bench
// scenarios, whose constructors take none (bench.go, newBenchEnv).
type appKey struct{}

// appFrom is the app ctx was run with, nil if none.
func appFrom(ctx context.Context) *app {
	if ctx == nil {
		return nil
	}
	a, _ := ctx.Value(appKey{}).(*app)
	return a
}

// logBuffer is a bytes.Buffer the client's goroutines may log into.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// oneLine returns what was logged as one line, records separated by
// "; " ("" if nothing was).
func (l *logBuffer) oneLine() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.ReplaceAll(strings.TrimSpace(l.b.String()), "\n", "; ")
}

// clientLogger is the client library's logger for a CLI command: into
// a.clientLog, at warn level (retries and hedges are debug), without the
// time and component attributes that would only lengthen an error line.
func (a *app) clientLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&a.clientLog, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, attr slog.Attr) slog.Attr {
			if len(groups) == 0 && (attr.Key == slog.TimeKey || attr.Key == "component") {
				return slog.Attr{}
			}
			return attr
		},
	}))
}

// usageError is a wrong command line: exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// runError is an error of a command that ran: exit 4 (3 when no store
// could be reached). Everything cobra
// returns that is not a runError (unknown command, bad flag, wrong number
// of arguments) is a usage error.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// silentError has been reported already; it only sets the exit code.
type silentError struct{ code int }

func (e silentError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// runE adapts a command body so that its errors count as run errors,
// unless it says they are usage errors.
func runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		var ue usageError
		var se silentError
		if err == nil || errors.As(err, &ue) || errors.As(err, &se) {
			return err
		}
		return runError{err}
	}
}

// run executes the command line, with nothing on standard input, and
// returns the exit code. Errors are printed by runWithStdin, as one line
// on stderr, never by cobra.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWithStdin(ctx, args, strings.NewReader(""), stdout, stderr)
}

// runWithStdin is run with a standard input for the commands that read
// one (put KEY -).
func runWithStdin(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return a.run(ctx, args)
}

// run executes the command line with a's streams and environment and
// returns the exit code.
func (a *app) run(ctx context.Context, args []string) int {
	stderr := a.stderr
	root := newRootCmd(a)
	a.root = root
	a.applyFlagEnv(root, args)
	root.SetArgs(args)
	root.SetOut(a.stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(context.WithValue(ctx, appKey{}, a))
	if a.stopProfile != nil {
		a.stopProfile()
	}
	if err == nil {
		return exitOK
	}
	var (
		se silentError
		re runError
		ue usageError
	)
	switch {
	case errors.As(err, &se):
		return se.code
	case errors.As(err, &ue) || !errors.As(err, &re):
		msg := firstLine(err.Error())
		if cmd != nil {
			msg += " (usage: " + cmd.UseLine() + ")"
		}
		fmt.Fprintf(stderr, "hedgekv: %s\n", msg)
		return exitUsage
	default:
		var ur unreachableError
		if errors.As(re.err, &ur) {
			// The short form: the client log would only repeat the dial
			// errors.
			fmt.Fprintf(stderr, "hedgekv: %s\n", ur.Error())
			return exitUnreachable
		}
		msg := describe(re.err)
		if l := a.clientLog.oneLine(); l != "" {
			msg += " (client log: " + l + ")"
		}
		fmt.Fprintf(stderr, "hedgekv: %s\n", msg)
		return exitFailure
	}
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "hedgekv",
		Short: "A Multi-Raft key-value store with follower read and hedged requests",
		Long: "A Multi-Raft key-value store with follower read and hedged requests.\n\n" +
			"Commands reach the stores at --endpoints, else at $" + endpointsEnv + ", else at " + defaultEndpoints + ".\n\n" +
			flagEnvHelp + "\n\n" + exitCodesHelp,
		Version: versionString(),
		// Errors and usage are reported by run, once, on one line.
		SilenceErrors: true,
		SilenceUsage:  true,
		// cobra's default for a command without Run is to print help and
		// succeed; an unknown subcommand must fail instead.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoints, "endpoints", "", "comma-separated gRPC addresses of stores (default $"+endpointsEnv+", else "+defaultEndpoints+")")
	pf.StringVar(&a.zone, "zone", "", "the zone this client sits in: --read follower and closest prefer its replicas, and stores that advertise an address for it (server --advertise-zone-addrs) are reached there")
	pf.DurationVar(&a.timeout, "timeout", 10*time.Second, "deadline of the whole command")
	pf.StringVar(&a.cpuProfile, "cpuprofile", "", "write a CPU profile of this command to `FILE` (for go tool pprof)")
	pf.StringVar(&a.tlsCert, "tls-cert", "", "mutual TLS: this client's certificate (server: the store's, used to serve and to dial peers); PEM `FILE` (hedgekv certs makes one)")
	pf.StringVar(&a.tlsKey, "tls-key", "", "mutual TLS: the key of --tls-cert, PEM `FILE`")
	pf.StringVar(&a.tlsCA, "tls-ca", "", "mutual TLS: the CA that signed the stores' and clients' certificates, PEM `FILE`")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := a.flagEnvError(cmd); err != nil {
			return err
		}
		return a.startProfile()
	}
	root.AddCommand(
		newPutCmd(a), newGetCmd(a), newDeleteCmd(a), newScanCmd(a),
		newCtlCmd(a),
		newEtcdRestoreCmd(a),
		newServerCmd(a),
		newBenchCmd(),
		newNetsimCmd(a),
		newCertsCmd(a),
		newVersionCmd(a),
	)
	root.SetVersionTemplate("{{.Version}}\n")
	return root
}

// connect creates a client for a command and a context bounded by
// --timeout that covers connecting and the request.
func (a *app) connect(ctx context.Context) (*client.Client, context.Context, func(), error) {
	if a.timeout <= 0 {
		return nil, nil, nil, usagef("--timeout must be positive, got %v", a.timeout)
	}
	eps, err := a.endpointList()
	if err != nil {
		return nil, nil, nil, err
	}
	tlsCfg, err := a.clientTLS()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	cli, err := client.New(ctx, client.Config{Endpoints: eps, Zone: a.zone, RequestTimeout: a.timeout, TLS: tlsCfg, Logger: a.clientLogger()})
	if err != nil {
		cancel()
		if tlsCfg == nil && status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "error reading server preface") {
			// A TLS store drops a plaintext client's connection without a
			// word, which looks like any broken store; say what it may be.
			return nil, nil, nil, fmt.Errorf("%w (stores that run with TLS need --tls-cert, --tls-key and --tls-ca)", err)
		}
		if cause, ok := unreachable(err); ok {
			return nil, nil, nil, unreachableError{endpoints: eps, cause: cause}
		}
		return nil, nil, nil, err
	}
	done := func() {
		_ = cli.Close()
		cancel()
	}
	if err := a.checkZone(ctx, cli); err != nil {
		done()
		return nil, nil, nil, err
	}
	return cli, ctx, done, nil
}

// endpointList is --endpoints, else $HEDGEKV_ENDPOINTS (which set the
// flag's default, flagenv.go), else the local cluster's default, split at
// commas.
func (a *app) endpointList() ([]string, error) {
	raw, from := a.endpoints, "--endpoints"
	if env, ok := a.flagEnv["endpoints"]; ok && !a.flagGiven("endpoints") {
		from = env
	}
	if raw == "" {
		raw, from = defaultEndpoints, "the default endpoints"
	}
	var eps []string
	for _, e := range strings.Split(raw, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, usagef("%s names no address", from)
	}
	return eps, nil
}

// checkZone refuses a --zone that no store is in and none advertises an
// address for: a typo would otherwise prefer nothing, silently. When the
// store list cannot be had the zone is not checked.
func (a *app) checkZone(ctx context.Context, cli *client.Client) error {
	if a.zone == "" {
		return nil
	}
	stores, err := cli.Stores(ctx)
	if err != nil || len(stores) == 0 {
		return nil
	}
	known := map[string]bool{}
	for _, s := range stores {
		if s.Zone != "" {
			known[s.Zone] = true
		}
		for z := range s.ZoneAddresses {
			known[z] = true
		}
	}
	if len(known) == 0 || known[a.zone] {
		return nil
	}
	return usagef("--zone %s: no store is in that zone (zones: %s)", a.zone, strings.Join(slices.Sorted(maps.Keys(known)), ", "))
}

// unreachableError is a client that could reach no store at all: said
// short, with the hint, instead of every dial error.
type unreachableError struct {
	endpoints []string
	cause     string
}

func (e unreachableError) Error() string {
	msg := "no store reachable at " + strings.Join(e.endpoints, ",")
	if e.cause != "" {
		msg += " (" + e.cause + ")"
	}
	return msg + ": is the cluster running? (--endpoints or $" + endpointsEnv + " name another)"
}

// unreachable reports whether every error in err's tree that names a
// store is a failure to reach it (Unavailable, or no answer before the
// deadline), with a short cause taken from the first.
func unreachable(err error) (string, bool) {
	var leaves []error
	var walk func(e error)
	walk = func(e error) {
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		default:
			leaves = append(leaves, e)
		}
	}
	walk(err)
	if len(leaves) == 0 {
		return "", false
	}
	for _, e := range leaves {
		switch status.Code(e) {
		case codes.Unavailable, codes.DeadlineExceeded:
		default:
			if !errors.Is(e, context.DeadlineExceeded) {
				return "", false
			}
		}
	}
	return shortCause(leaves[0]), true
}

// shortCause is the end of a dial error: "connection refused", "no such
// host", "i/o timeout"; "no answer in time" for a deadline.
func shortCause(err error) string {
	if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
		return "no answer in time"
	}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	msg = strings.TrimRight(strings.TrimSpace(msg), `"`)
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	if len(msg) > 60 {
		msg = msg[:60] + "..."
	}
	return msg
}

// withClient is the shape of every command that talks to the cluster:
// connect (within --timeout), run fn with the client and the command's
// context, close the client.
func (a *app) withClient(cmd *cobra.Command, fn func(ctx context.Context, cli *client.Client) error) error {
	cli, ctx, done, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	defer done()
	return fn(ctx, cli)
}

// tlsFlagsGiven checks that --tls-cert, --tls-key and --tls-ca come all
// three or not at all (a usage error otherwise) and says which.
func (a *app) tlsFlagsGiven() (bool, error) {
	given := 0
	var missing []string
	for _, f := range []struct{ name, v string }{{"--tls-cert", a.tlsCert}, {"--tls-key", a.tlsKey}, {"--tls-ca", a.tlsCA}} {
		if f.v != "" {
			given++
		} else {
			missing = append(missing, f.name)
		}
	}
	switch given {
	case 0:
		return false, nil
	case 3:
		return true, nil
	}
	return false, usagef("--tls-cert, --tls-key and --tls-ca go together: %s missing", strings.Join(missing, " and "))
}

// clientTLS is the client's TLS config from the TLS flags, nil without
// them. Files that cannot be loaded are a run error.
func (a *app) clientTLS() (*tls.Config, error) {
	on, err := a.tlsFlagsGiven()
	if !on || err != nil {
		return nil, err
	}
	cfg, err := client.LoadTLS(a.tlsCert, a.tlsKey, a.tlsCA)
	if err != nil {
		return nil, runError{err}
	}
	return cfg, nil
}

// exactArgs is cobra.ExactArgs with names in the message.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) && len(names) == 0 {
			return usagef("%s takes no arguments, got %d", cmd.Name(), len(args))
		}
		if len(args) != len(names) {
			return usagef("%s takes %d argument(s) (%s), got %d", cmd.Name(), len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}

// describe renders an error for the one-line report. gRPC status errors
// are shown as their code and message rather than grpc's "rpc error: code
// = X desc = Y"; the client's own errors already read that way.
func describe(err error) string {
	msg := err.Error()
	if st, ok := status.FromError(err); ok && strings.HasPrefix(msg, "rpc error: ") {
		msg = fmt.Sprintf("%s: %s", st.Code(), st.Message())
	}
	return strings.ReplaceAll(strings.TrimSpace(msg), "\n", " ")
}

// firstLine keeps the first line of cobra's multi-line messages (which go
// on with suggestions and a pointer to --help).
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(s)
}

func init() {
	// The client logs retries at debug level; a CLI user sees only what
	// goes wrong. The server command installs its own logger.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// startProfile starts the --cpuprofile CPU profile; run stops it once the
// command returns, so a benchmark's client side can be profiled like a
// store's /debug/pprof.
func (a *app) startProfile() error {
	if a.cpuProfile == "" {
		return nil
	}
	f, err := os.Create(a.cpuProfile)
	if err != nil {
		return runError{fmt.Errorf("cpu profile: %w", err)}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return runError{fmt.Errorf("cpu profile: %w", err)}
	}
	a.stopProfile = func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(a.stderr, "hedgekv: cpu profile: %v\n", err)
		}
	}
	return nil
}
