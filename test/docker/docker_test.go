// Package docker runs hedgekv the way deploy/compose.yaml ships it: the
// image built from the Dockerfile (FROM scratch, the static binary), three
// stores in three containers on a private bridge network, found by
// hostname. It cuts the leader's container off the network with `docker
// network disconnect` and checks that the other two keep taking writes and
// linearizable reads, that the cut-off store answers no read with the value
// the majority has since overwritten, and that it catches up once it is
// reconnected.
//
// Every client runs inside a container (`docker exec CONTAINER /hedgekv
// ...`; the image has no shell, but the binary is all exec needs): a store
// cut off the network can only be asked from inside its own container, and
// Docker's bridge addresses are not reachable from the host everywhere
// (rootless Docker, Docker Desktop), names on the network resolve only
// inside it.
//
// The static binary comes from $HEDGEKV_STATIC_BIN (the Makefile passes
// bin/hedgekv-static); otherwise TestMain builds one with CGO_ENABLED=0. The
// test skips, saying why, when no Docker engine answers or no compose tool
// is installed. Everything it creates (the image tag, the compose project's
// containers, network and volumes) carries a per-run name and is removed at
// the end, on failure and on SIGINT/SIGTERM too.
package docker

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// budget bounds the whole scenario, well inside the Makefile's go test
	// -timeout, so that a hang fails the test with the cleanups still to
	// run rather than killing the binary before they do.
	budget = 3 * time.Minute
	// dockerTimeout bounds one docker or compose command (build, up, down).
	dockerTimeout = 90 * time.Second
	// cliTimeout is the CLI's own --timeout for ordinary commands.
	cliTimeout = 5 * time.Second
	// cutOffTimeout is the CLI's --timeout for a request to the cut-off
	// store: it cannot succeed, so it is kept short.
	cutOffTimeout = 2 * time.Second
	// leaderWait bounds the wait for region 1's first leader.
	leaderWait = 60 * time.Second
	// failoverWait bounds the wait for the majority's first write after
	// the leader is cut off.
	failoverWait = 20 * time.Second
	// catchUpWait bounds the wait for the reconnected store to serve the
	// new value. gRPC backs off redialling a peer it lost for up to
	// seconds, so this is generous.
	catchUpWait = 45 * time.Second
	// stores is the cluster size deploy/compose.yaml defines; store N is
	// service hedgekv-N, listening on grpcPort in its container.
	stores   = 3
	grpcPort = 20160
)

var (
	repoRoot  string // absolute path of the repository
	staticBin string // the statically linked hedgekv the image is built from
	setupErr  error  // why the binary is not available
	skipWhy   string // non-empty: skip, with this reason
	compose   []string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		setupErr = fmt.Errorf("repository root: %w", err)
		return m.Run()
	}
	repoRoot = root
	if why := dockerMissing(); why != "" {
		skipWhy = why
		return m.Run()
	}
	// Cleanups registered by the test also run on an interrupt: go test
	// relays SIGINT to the test binary, which would otherwise die with the
	// containers still running.
	stopSignals := onSignal()
	defer stopSignals()
	bin, cleanup, err := locateStatic(root)
	if err != nil {
		setupErr = err
		return m.Run()
	}
	defer cleanup()
	staticBin = bin
	return m.Run()
}

// dockerMissing says why the test cannot run here ("" if it can): no docker
// CLI, no engine answering it, or no compose tool. It also picks the
// compose tool: docker-compose (v1, Debian's package) or the compose plugin.
func dockerMissing() string {
	if _, err := exec.LookPath("docker"); err != nil {
		return "docker not found on PATH"
	}
	if r := run(context.Background(), 30*time.Second, nil, "docker", "info", "--format", "{{.ServerVersion}}"); r.err != nil {
		return fmt.Sprintf("no Docker engine answers `docker info`: %v", r)
	}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		compose = []string{"docker-compose"}
		return ""
	}
	if r := run(context.Background(), 30*time.Second, nil, "docker", "compose", "version"); r.err == nil {
		compose = []string{"docker", "compose"}
		return ""
	}
	return "neither docker-compose nor the docker compose plugin is installed"
}

// locateStatic returns $HEDGEKV_STATIC_BIN, or builds a static binary into
// a temporary directory, and checks that it is static: in a scratch image
// a dynamically linked binary fails with a bare "no such file or directory"
// (its loader is missing), which would be a confusing way to fail.
func locateStatic(root string) (string, func(), error) {
	nothing := func() {}
	if p := os.Getenv("HEDGEKV_STATIC_BIN"); p != "" {
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		if err := checkStatic(p); err != nil {
			return "", nothing, fmt.Errorf("HEDGEKV_STATIC_BIN: %w", err)
		}
		return p, nothing, nil
	}
	dir, err := os.MkdirTemp("", "hedgekv-docker-bin-")
	if err != nil {
		return "", nothing, fmt.Errorf("temporary directory for the static build: %w", err)
	}
	cleanup := func() { os.RemoveAll(dir) }
	p := filepath.Join(dir, "hedgekv")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", p, "./cmd/hedgekv")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nothing, fmt.Errorf("CGO_ENABLED=0 go build ./cmd/hedgekv: %w\n%s", err, out)
	}
	if err := checkStatic(p); err != nil {
		cleanup()
		return "", nothing, err
	}
	return p, cleanup, nil
}

// checkStatic fails if the ELF file at p asks for a dynamic loader.
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (build it with CGO_ENABLED=0): a scratch image has no loader for it", p)
		}
	}
	return nil
}

// cleanups run at the end of the test (t.Cleanup) or on SIGINT/SIGTERM,
// whichever comes first, each at most once.
var cleanups struct {
	sync.Mutex
	fns []func()
}

func registerCleanup(t *testing.T, f func()) {
	var once sync.Once
	g := func() { once.Do(f) }
	cleanups.Lock()
	cleanups.fns = append(cleanups.fns, g)
	cleanups.Unlock()
	t.Cleanup(g)
}

func runCleanups() {
	cleanups.Lock()
	fns := cleanups.fns
	cleanups.fns = nil
	cleanups.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

func onSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			fmt.Fprintf(os.Stderr, "test/docker: %v: removing the containers, network, volumes and image tag\n", s)
			runCleanups()
			os.Exit(1)
		case <-done:
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// result is what one process invocation produced.
type result struct {
	stdout, stderr string
	err            error
	elapsed        time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("err=%v stdout=%q stderr=%q (%v)", r.err, r.stdout, r.stderr, r.elapsed.Round(time.Millisecond))
}

// out is stdout without its final newline: the value a get printed.
func (r result) out() string { return strings.TrimSuffix(r.stdout, "\n") }

// run executes name args... bounded by timeout and ctx; env adds to the
// test's environment.
func run(ctx context.Context, timeout time.Duration, env []string, name string, args ...string) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: timed out after %v: %w", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond), err)
	} else if err != nil {
		err = fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return result{stdout.String(), stderr.String(), err, time.Since(start)}
}

// cluster is one compose project of deploy/compose.yaml.
type cluster struct {
	t       *testing.T
	ctx     context.Context // the scenario's budget
	project string
	env     []string       // HEDGEKV_IMAGE and the ports for compose
	ids     map[int]string // store -> container id
	network string         // the compose network's full name
	aliases map[int][]string
}

// serviceAddr is store n's gRPC address on the compose network.
func serviceAddr(n int) string { return fmt.Sprintf("hedgekv-%d:%d", n, grpcPort) }

// endpoints lists the given stores' addresses on the network.
func endpoints(ns ...int) string {
	addrs := make([]string, len(ns))
	for i, n := range ns {
		addrs[i] = serviceAddr(n)
	}
	return strings.Join(addrs, ",")
}

func allStores() []int {
	ns := make([]int, stores)
	for i := range ns {
		ns[i] = i + 1
	}
	return ns
}

// local is the address a store's own container reaches it at, whatever
// networks it is on.
var local = "127.0.0.1:" + strconv.Itoa(grpcPort)

func (c *cluster) docker(args ...string) result {
	return run(c.ctx, dockerTimeout, nil, "docker", args...)
}

func (c *cluster) compose(ctx context.Context, args ...string) result {
	full := append(append([]string{}, compose[1:]...), "-p", c.project, "-f", filepath.Join(repoRoot, "deploy", "compose.yaml"))
	return run(ctx, dockerTimeout, c.env, compose[0], append(full, args...)...)
}

// cli runs the hedgekv CLI inside store in's container against eps, with
// the CLI's own deadline d; the docker exec gets a little more, so that it
// is the CLI that gives up and says why.
func (c *cluster) cli(in int, eps string, d time.Duration, args ...string) result {
	full := append([]string{"exec", c.ids[in], "/hedgekv"}, args...)
	full = append(full, "--endpoints", eps, "--timeout", d.String())
	return run(c.ctx, d+15*time.Second, nil, "docker", full...)
}

// untilOK retries f until it succeeds or giveUp has passed; it returns how
// long that took and the last result.
func (c *cluster) untilOK(giveUp time.Duration, f func() result) (time.Duration, result, bool) {
	start := time.Now()
	for {
		r := f()
		if r.err == nil {
			return time.Since(start), r, true
		}
		if time.Since(start) > giveUp || c.ctx.Err() != nil {
			return time.Since(start), r, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// randomSuffix names this run's resources.
func randomSuffix(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("random run id: %v", err)
	}
	return hex.EncodeToString(b[:])
}

// buildImage stages the build context the way `make image` does (the
// binary and an empty data directory, nothing else) and builds the
// repository's Dockerfile into a tag of this run's own.
func buildImage(t *testing.T, ctx context.Context, tag string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatalf("staging the build context: %v", err)
	}
	if err := copyFile(staticBin, filepath.Join(dir, "hedgekv")); err != nil {
		t.Fatalf("staging the build context: %v", err)
	}
	registerCleanup(t, func() {
		if r := run(context.Background(), dockerTimeout, nil, "docker", "rmi", "-f", tag); r.err != nil {
			t.Errorf("removing image %s: %v", tag, r)
		}
	})
	r := run(ctx, dockerTimeout, nil, "docker", "build", "-q", "-f", filepath.Join(repoRoot, "Dockerfile"), "-t", tag, dir)
	if r.err != nil {
		t.Fatalf("docker build: %v", r)
	}
	t.Logf("built %s (%s) in %v", tag, strings.TrimSpace(r.stdout), r.elapsed.Round(time.Millisecond))
	// The store needs no privilege, and the volume's ownership (the data
	// directory in the image) assumes this user.
	if r := run(ctx, dockerTimeout, nil, "docker", "image", "inspect", "--format", "{{.Config.User}}", tag); r.err != nil || r.out() != "65532:65532" {
		t.Fatalf("image %s runs as %q, want 65532:65532 (%v)", tag, r.out(), r.err)
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("copy %s: %w", from, err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", to, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", from, to, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copy to %s: %w", to, err)
	}
	return nil
}

// startCluster brings deploy/compose.yaml up as its own project, with the
// published ports on free host ports (so that it collides neither with a
// local cluster on the defaults nor with another run).
func startCluster(t *testing.T, ctx context.Context, tag, project string) *cluster {
	t.Helper()
	c := &cluster{t: t, ctx: ctx, project: project, env: []string{"HEDGEKV_IMAGE=" + tag}, ids: map[int]string{}, aliases: map[int][]string{}}
	for n := 1; n <= stores; n++ {
		c.env = append(c.env, fmt.Sprintf("HEDGEKV_PORT_%d=0", n), fmt.Sprintf("HEDGEKV_STATUS_PORT_%d=0", n))
	}
	registerCleanup(t, c.remove)
	if r := c.compose(ctx, "up", "-d", "--no-build"); r.err != nil {
		t.Fatalf("compose up: %v", r)
	} else {
		t.Logf("compose project %s up in %v", project, r.elapsed.Round(time.Millisecond))
	}
	for n := 1; n <= stores; n++ {
		r := c.compose(ctx, "ps", "-q", fmt.Sprintf("hedgekv-%d", n))
		id := strings.TrimSpace(r.stdout)
		if r.err != nil || id == "" || strings.ContainsAny(id, " \n") {
			t.Fatalf("container of hedgekv-%d: %v", n, r)
		}
		c.ids[n] = id
		net, aliases, err := c.networkOf(n)
		if err != nil {
			t.Fatal(err)
		}
		if c.network != "" && net != c.network {
			t.Fatalf("hedgekv-%d is on network %s, hedgekv-1 on %s: want one network", n, net, c.network)
		}
		c.network, c.aliases[n] = net, aliases
	}
	return c
}

// networkOf returns the one network store n's container is on and its
// names there (which a reconnect must restore: its peers dial it by them).
func (c *cluster) networkOf(n int) (string, []string, error) {
	r := c.docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", c.ids[n])
	if r.err != nil {
		return "", nil, fmt.Errorf("inspecting hedgekv-%d: %v", n, r)
	}
	var nets map[string]struct{ Aliases []string }
	if err := json.Unmarshal([]byte(r.stdout), &nets); err != nil {
		return "", nil, fmt.Errorf("hedgekv-%d's networks %q: %w", n, r.stdout, err)
	}
	if len(nets) != 1 {
		return "", nil, fmt.Errorf("hedgekv-%d is on %d networks, want 1: %s", n, len(nets), r.stdout)
	}
	for name, v := range nets {
		var aliases []string
		for _, a := range v.Aliases {
			// Docker adds the short container id itself on connect.
			if !strings.HasPrefix(c.ids[n], a) {
				aliases = append(aliases, a)
			}
		}
		return name, aliases, nil
	}
	panic("unreachable")
}

// remove takes the project down with its volumes; if that fails, it
// removes what carries the project's label one by one. On failure it first
// prints the stores' logs.
func (c *cluster) remove() {
	ctx := context.Background() // the scenario's budget may be spent
	if c.t.Failed() {
		for n := 1; n <= stores; n++ {
			if id := c.ids[n]; id != "" {
				r := run(ctx, 30*time.Second, nil, "docker", "logs", "--tail", "60", id)
				c.t.Logf("--- hedgekv-%d log (last 60 lines) ---\n%s%s", n, r.stdout, r.stderr)
			}
		}
	}
	down := c.compose(ctx, "down", "-v", "--remove-orphans", "-t", "5")
	label := "label=com.docker.compose.project=" + c.project
	var left []string
	for _, kind := range []string{"container", "network", "volume"} {
		args := []string{kind, "ls", "-q", "--filter", label}
		if kind == "container" {
			args = []string{"ps", "-aq", "--filter", label}
		}
		r := run(ctx, 30*time.Second, nil, "docker", args...)
		for _, id := range strings.Fields(r.stdout) {
			rm := []string{kind, "rm", "-f", id}
			if kind == "network" {
				rm = []string{kind, "rm", id}
			}
			if r := run(ctx, 30*time.Second, nil, "docker", rm...); r.err != nil {
				left = append(left, fmt.Sprintf("%s %s: %v", kind, id, r))
			}
		}
	}
	if down.err != nil {
		c.t.Errorf("compose down: %v", down)
	}
	if len(left) > 0 {
		c.t.Errorf("could not remove: %s", strings.Join(left, "; "))
	}
}

type regionJSON struct {
	ID            uint64 `json:"id"`
	LeaderStoreID int    `json:"leader_store_id"`
}

// leaderOfRegion1 asks stores through store `via` who leads region 1,
// waiting (bounded) for a leader.
func (c *cluster) leaderOfRegion1(via int, eps string, wait time.Duration) (int, time.Duration) {
	c.t.Helper()
	var leader int
	took, r, ok := c.untilOK(wait, func() result {
		r := c.cli(via, eps, cliTimeout, "ctl", "regions", "--json")
		if r.err != nil {
			return r
		}
		var rs []regionJSON
		if err := json.Unmarshal([]byte(r.stdout), &rs); err != nil {
			r.err = fmt.Errorf("ctl regions --json: %w", err)
			return r
		}
		for _, reg := range rs {
			if reg.ID == 1 && reg.LeaderStoreID != 0 {
				leader = reg.LeaderStoreID
				return r
			}
		}
		r.err = errors.New("region 1 has no leader yet")
		return r
	})
	if !ok {
		c.t.Fatalf("region 1 has no leader after %v: %v", took.Round(time.Millisecond), r)
	}
	return leader, took
}

func (c *cluster) mustPut(via int, eps, k, v string) {
	c.t.Helper()
	if r := c.cli(via, eps, cliTimeout, "put", k, v); r.err != nil {
		c.t.Fatalf("put %s=%s via hedgekv-%d: %v", k, v, via, r)
	}
}

func (c *cluster) mustGet(via int, eps, k, want string, args ...string) {
	c.t.Helper()
	r := c.cli(via, eps, cliTimeout, append([]string{"get", k}, args...)...)
	if r.err != nil {
		c.t.Fatalf("get %s %v via hedgekv-%d: %v", k, args, via, r)
	}
	if r.out() != want {
		c.t.Fatalf("get %s %v via hedgekv-%d = %q, want %q", k, args, via, r.out(), want)
	}
}

// zoneOf asks store n itself which zone it is in.
func (c *cluster) zoneOf(n int) string {
	c.t.Helper()
	r := c.cli(n, local, cliTimeout, "ctl", "stores", "--json")
	if r.err != nil {
		c.t.Fatalf("ctl stores on hedgekv-%d: %v", n, r)
	}
	var ss []struct {
		ID   int    `json:"id"`
		Zone string `json:"zone"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ss); err != nil {
		c.t.Fatalf("ctl stores --json on hedgekv-%d: %v in %q", n, err, r.stdout)
	}
	for _, s := range ss {
		if s.ID == n && s.Zone != "" {
			return s.Zone
		}
	}
	c.t.Fatalf("hedgekv-%d does not report its zone: %s", n, r.stdout)
	return ""
}

func TestContainerCluster(t *testing.T) {
	if skipWhy != "" {
		t.Skip("skipped: " + skipWhy)
	}
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	id := randomSuffix(t)
	tag := "hedgekv-e2e:" + id
	buildImage(t, ctx, tag)
	c := startCluster(t, ctx, tag, "hedgekvdocker"+id)
	all := endpoints(allStores()...)

	// A leader, then writes and reads through the network's names.
	leader, took := c.leaderOfRegion1(1, all, leaderWait)
	t.Logf("region 1 led by store %d, %v after compose up", leader, took.Round(time.Millisecond))
	for i := range 5 {
		c.mustPut(1+i%stores, all, fmt.Sprintf("docker/k%d", i), fmt.Sprintf("v%d", i))
	}
	for i := range 5 {
		c.mustGet(1+(i+1)%stores, all, fmt.Sprintf("docker/k%d", i), fmt.Sprintf("v%d", i))
		c.mustGet(1+(i+2)%stores, all, fmt.Sprintf("docker/k%d", i), fmt.Sprintf("v%d", i), "--read", "follower")
	}

	p := c.cutLeader(all)
	c.majorityTakesWrite(p)
	c.probeCutOff(p)
	c.majorityServes(p)
	c.staleReadRefused(p)
	t.Logf("store %d was cut off for %v", p.cut, time.Since(p.at).Round(time.Millisecond))
	c.reconnect(p)
	healedAt := time.Now()
	c.catchesUp(p, all)
	t.Logf("cluster whole again %v after the reconnect", time.Since(healedAt).Round(time.Millisecond))

	// restart: unless-stopped would hide a store that crashed and came
	// back; none may have.
	for n := 1; n <= stores; n++ {
		r := c.docker("inspect", "--format", "{{.RestartCount}} {{.State.Status}}", c.ids[n])
		if got := strings.TrimSpace(r.stdout); r.err != nil || got != "0 running" {
			t.Errorf("hedgekv-%d: restart count and state %q, want \"0 running\" (%v)", n, got, r.err)
		}
	}
	t.Logf("scenario took %v", time.Since(began).Round(time.Millisecond))
}
