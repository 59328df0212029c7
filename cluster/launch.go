// Package cluster starts the clusters the tests, the benchmarks and the CLI
// run against: real stores in this process on loopback gRPC, optionally
// behind the simulated WAN (local.go), stores as processes of the hedgekv
// binary (proc.go), and an etcd cluster for the comparisons (etcd.go, with
// the peer fronts that put its members behind the WAN in etcdpeerfront.go).
// This file holds what they share: ports, directories, logs, and the
// child processes of the last two.
package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// startRetryingPorts returns what start returns, calling it again (up to
// three times in all) while it fails because a port it picked was taken
// before its process bound it, when ownDir says the data directory is the
// cluster's own (a fresh one each time). what names the cluster in the log.
func startRetryingPorts[C any](what string, ownDir bool, logger *slog.Logger, start func() (C, error)) (C, error) {
	for attempt := 1; ; attempt++ {
		c, err := start()
		if err == nil || !ownDir || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		if logger != nil {
			logger.Info(what+": a port was taken; starting again on new ports", "err", err)
		}
	}
}

// clusterDir is the directory a cluster keeps its data and logs in: dir,
// or if dir is "" a new temporary one, the cluster's own (removed when it
// stops).
func clusterDir(dir, pattern string) (_ string, own bool, err error) {
	if dir != "" {
		return dir, false, nil
	}
	dir, err = os.MkdirTemp("", pattern)
	return dir, true, err
}

// reservePorts returns n distinct free TCP ports on 127.0.0.1, held
// (bound) until release, which may be called more than once. Once released
// they are free only as long as nobody else binds them.
func reservePorts(n int) (ports []int, release func(), err error) {
	var ls []net.Listener
	release = func() {
		for _, l := range ls {
			_ = l.Close()
		}
		ls = nil
	}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			release()
			return nil, func() {}, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, release, nil
}

// child is one process a cluster started: a store or an etcd member.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // set before exited is closed
}

// startChild starts binary with args, its output going to logFile (closed
// once it exits, or at once if it cannot start), with env (nil: ours).
func startChild(binary string, args []string, env []string, logFile *os.File) (*child, error) {
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = env
	// Killed with us if this process dies without stopping it.
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	r := &child{cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		_ = logFile.Close()
		close(r.exited)
	}()
	return r, nil
}

func (r *child) running() bool {
	if r == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// stopChildren sends every running child SIGTERM and waits until all have
// exited, killing (SIGKILL) those still running once grace has passed,
// each after telling killing its index in cs.
func stopChildren(cs []*child, grace time.Duration, killing func(i int)) {
	for _, r := range cs {
		if r.running() {
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	expired := false
	for i, r := range cs {
		if !expired {
			select {
			case <-r.exited:
				continue
			case <-deadline.C:
				expired = true
			}
		}
		if r.running() {
			killing(i)
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	}
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

// MinLevel is l (slog.Default() if nil) dropping records below min.
func MinLevel(l *slog.Logger, min slog.Level) *slog.Logger {
	if l == nil {
		l = slog.Default()
	}
	return slog.New(levelHandler{Handler: l.Handler(), min: min})
}

// levelHandler drops records below min.
type levelHandler struct {
	slog.Handler
	min slog.Level
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelHandler{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{Handler: h.Handler.WithGroup(name), min: h.min}
}
