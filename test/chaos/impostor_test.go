package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// impostor is the fault of an address that changed hands: store n is
// killed and, for hold, a store of another cluster (the same store ID,
// command line and ports, a fresh data dir, another --cluster-token)
// serves at its address, as a replaced host or a port another cluster
// bound would. The cluster's leaders go on sending store n its regions'
// raft there, and the impostor's own region 1 (peers 1-3 on stores 1-3,
// as every cluster's) asks the real stores for votes. Each side must
// refuse the other: taken as its own, a leader's heartbeat, whose commit
// the impostor's log never held, panicked the impostor's raft. It fails
// the run if the impostor exits before it is killed or logs a panic.
func (n *nemesis) impostor(store int, hold time.Duration, seq int) {
	t := n.c.t
	raw, err := os.ReadFile(filepath.Join(n.c.dir, fmt.Sprintf("store%d.args", store)))
	if err != nil {
		t.Errorf("impostor of store %d: its command line: %v", store, err)
		return
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	dataDir := filepath.Join(n.c.dir, fmt.Sprintf("impostor%d-%d", store, seq))
	args = withFlag(args, "--data-dir", dataDir)
	args = withFlag(args, "--cluster-token", fmt.Sprintf("impostor-%d", seq))
	logPath := dataDir + ".log"
	logf, err := os.Create(logPath)
	if err != nil {
		t.Errorf("impostor of store %d: %v", store, err)
		return
	}
	defer logf.Close()
	cmd := exec.Command(n.c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Errorf("impostor of store %d: start: %v", store, err)
		return
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Held for hold, and until the impostor has refused the cluster's
	// raft at least once (a leader heartbeats every 100 ms; the
	// impostor first has to start), at most refuseWithin.
	const refuseWithin = 15 * time.Second
	start := time.Now()
	refused := func() bool {
		out, _ := os.ReadFile(logPath)
		return bytes.Contains(out, []byte("refused a call from another cluster"))
	}
	for done := false; !done; {
		select {
		case err := <-exited:
			t.Errorf("impostor of store %d exited by itself after %v (%v); its log: %s", store, time.Since(start).Round(time.Millisecond), err, logPath)
			done = true
			continue
		case <-time.After(100 * time.Millisecond):
		}
		if since := time.Since(start); since >= refuseWithin || (since >= hold && refused()) {
			_ = cmd.Process.Kill()
			<-exited
			done = true
		}
	}
	out, _ := os.ReadFile(logPath)
	if i := bytes.Index(out, []byte("panic:")); i >= 0 {
		t.Errorf("impostor of store %d panicked: %s", store, firstLine(out[i:]))
	} else if !refused() {
		t.Errorf("impostor of store %d refused nothing in %v: the cluster's raft never reached it (its log: %s)", store, refuseWithin, logPath)
	} else {
		t.Logf("impostor of store %d served %v and refused the cluster's raft", store, time.Since(start).Round(time.Millisecond))
		_ = os.RemoveAll(dataDir)
	}
}

// withFlag sets flag's value in a command line (the flag and its value as
// two arguments), appending the pair if the flag is not there.
func withFlag(args []string, flag, value string) []string {
	args = slices.Clone(args)
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			args[i+1] = value
			return args
		}
		if strings.HasPrefix(a, flag+"=") {
			args[i] = flag + "=" + value
			return args
		}
	}
	return append(args, flag, value)
}

func firstLine(b []byte) string {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
