package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ErrEtcdNotFound says no etcd binary was found.
var ErrEtcdNotFound = errors.New("etcd binary not found on PATH; install it with `apt-get install etcd-server` (Debian/Ubuntu) or pass its path")

// FindEtcd returns the etcd binary to run: explicit if set (a path or a name
// looked up on PATH), else "etcd" on PATH.
func FindEtcd(explicit string) (string, error) {
	name := explicit
	if name == "" {
		name = "etcd"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w (%w)", ErrEtcdNotFound, err)
	}
	return p, nil
}

// EtcdVersion returns the first line of `etcd --version`.
func EtcdVersion(ctx context.Context, binary string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// EtcdClusterConfig configures StartEtcdCluster.
type EtcdClusterConfig struct {
	Binary  string // from FindEtcd
	Members int    // default 3
	// Dir holds each member's data and log; "" makes a temporary directory
	// that Stop removes.
	Dir          string
	ReadyTimeout time.Duration // default 30s
	Logger       *slog.Logger
}

// EtcdCluster is a local etcd cluster of child processes on loopback ports.
type EtcdCluster struct {
	Endpoints []string
	members   []*etcdMember
	dir       string
	ownDir    bool
	logger    *slog.Logger
}

type etcdMember struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	err     error // set before exited is closed
}

// StartEtcdCluster starts cfg.Members etcd processes forming one cluster on
// free 127.0.0.1 ports and waits until it has a leader and serves reads.
func StartEtcdCluster(ctx context.Context, cfg EtcdClusterConfig) (_ *EtcdCluster, err error) {
	if cfg.Members <= 0 {
		cfg.Members = 3
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Binary == "" {
		if cfg.Binary, err = FindEtcd(""); err != nil {
			return nil, err
		}
	}
	c := &EtcdCluster{dir: cfg.Dir, logger: cfg.Logger}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "hedgekv-bench-etcd-*"); err != nil {
			return nil, fmt.Errorf("etcd cluster: %w", err)
		}
		c.ownDir = true
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	ports, err := freePorts(2 * cfg.Members)
	if err != nil {
		return nil, fmt.Errorf("etcd cluster: %w", err)
	}
	var initial []string
	for i := range cfg.Members {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	for i := range cfg.Members {
		name := fmt.Sprintf("m%d", i+1)
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		args := []string{
			"--name", name,
			"--data-dir", filepath.Join(c.dir, name),
			"--listen-client-urls", client,
			"--advertise-client-urls", client,
			"--listen-peer-urls", peer,
			"--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", "hedgekv-bench",
			"--initial-cluster-state", "new",
			"--logger", "zap",
			"--log-outputs", "stderr",
			"--log-level", "warn",
		}
		m, err := startEtcdMember(cfg.Binary, name, args, filepath.Join(c.dir, name+".log"))
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
		c.Endpoints = append(c.Endpoints, client)
	}
	cfg.Logger.Info("etcd cluster starting", "members", cfg.Members, "endpoints", strings.Join(c.Endpoints, ","), "dir", c.dir)
	if err := c.waitReady(ctx, cfg.ReadyTimeout); err != nil {
		return nil, err
	}
	return c, nil
}

func startEtcdMember(binary, name string, args []string, logPath string) (*etcdMember, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// No ETCD_* settings of ours may leak into the members.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("etcd member %s: start %s: %w", name, binary, err)
	}
	m := &etcdMember{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		m.err = cmd.Wait()
		_ = logFile.Close()
		close(m.exited)
	}()
	return m, nil
}

func (c *EtcdCluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd cluster: client: %w", err)
	}
	defer cli.Close()
	var lastErr error
	for {
		for _, m := range c.members {
			select {
			case <-m.exited:
				return fmt.Errorf("etcd member %s exited during start-up (%v); its log ends with:\n%s", m.name, m.err, tail(m.logPath, 20))
			default:
			}
		}
		if lastErr = c.ready(ctx, cli); lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd cluster not ready after %v: %w; member m1's log ends with:\n%s", timeout, lastErr, tail(c.members[0].logPath, 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ready: every member reports the same leader, and a linearizable read works.
func (c *EtcdCluster) ready(ctx context.Context, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var leader uint64
	for _, ep := range c.Endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("status of %s: %w", ep, err)
		}
		if st.Leader == 0 || (leader != 0 && st.Leader != leader) {
			return fmt.Errorf("%s: no agreed leader yet", ep)
		}
		leader = st.Leader
	}
	if _, err := cli.Get(ctx, "hedgekv-bench-ready"); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

// Stop terminates the members (SIGTERM, then SIGKILL after 2s: members
// stopping together spend seconds trying to hand leadership over, and a
// benchmark cluster's data is disposable) and removes a temporary data
// directory. Safe to call more than once.
func (c *EtcdCluster) Stop() {
	for _, m := range c.members {
		select {
		case <-m.exited:
			continue
		default:
		}
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
	expired := false
	for _, m := range c.members {
		if !expired {
			select {
			case <-m.exited:
				continue
			case <-deadline.C:
				expired = true
			}
		}
		select {
		case <-m.exited:
		default:
			c.logger.Debug("etcd member still running 2s after SIGTERM; killing it", "member", m.name)
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	}
	c.members = nil
	if c.ownDir && c.dir != "" {
		_ = os.RemoveAll(c.dir)
		c.dir = ""
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1 (free when
// asked: another process could take one before it is used).
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
