package crash

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/cluster"
)

// TestDiskFullUnderWriteLoad fills one store's disk (its lossyfs mount
// refuses every write with ENOSPC) under write load, then a power cut
// while it is full, then gives the space back: the store says why it
// stopped taking writes, the other two go on, nothing acknowledged is
// lost, and the store takes writes again once space returns.
func TestDiskFullUnderWriteLoad(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	pc := startPowerCluster(t, seed, cluster.ProcessesConfig{})
	w := startWriters(pc.cli, 4)
	defer w.stop()
	const victim = 1
	time.Sleep(time.Second)
	before := w.ackedCount()
	pc.mounts[victim].SetFull(true)
	time.Sleep(3 * time.Second)
	during := w.ackedCount()
	if during <= before {
		t.Errorf("no write was acknowledged while store %d's disk was full (%d before, %d after)", victim, before, during)
	}
	// The store says why it stopped.
	if line := logLine(t, pc.c.LogPath(victim), "no space left on device"); line != "" {
		t.Logf("store %d: %s", victim, line)
	} else {
		t.Errorf("store %d's log never says its disk is full; its log ends with:\n%s", victim, logTail(pc.c.LogPath(victim), 20))
	}
	// A power cut while full: what it acknowledged before is on its disk.
	if err := pc.c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	pc.mounts[victim].SetFull(false)
	pc.cutMounts("cut while full", cutModes[seed%3], victim)
	pc.restart("cut while full", victim)
	// Full again, this time space comes back under the running store: once
	// it has met the full disk. It meets it in one of two ways: a round's
	// write fails and the store freezes, or, if the cut left it behind the
	// leader's log, the snapshot it needs cannot be received (it writes
	// nothing else until it has one). One that never failed a write has
	// nothing to recover from.
	metFull := func() (frozen, refused int) {
		return logCount(t, pc.c.LogPath(victim), "disk write failed"),
			logCount(t, pc.c.LogPath(victim), "receiving a snapshot failed")
	}
	frozenBefore, refusedBefore := metFull()
	pc.mounts[victim].SetFull(true)
	time.Sleep(2 * time.Second)
	frozen, refused := metFull()
	for wait := time.Now().Add(20 * time.Second); frozen == frozenBefore && refused == refusedBefore; frozen, refused = metFull() {
		if time.Now().After(wait) {
			t.Fatalf("store %d wrote nothing for 22 s after its restart while its disk was full; its log ends with:\n%s",
				victim, logTail(pc.c.LogPath(victim), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	pc.mounts[victim].SetFull(false)
	if frozen > frozenBefore {
		deadline := time.Now().Add(30 * time.Second)
		for !logHas(t, pc.c.LogPath(victim), "disk takes writes again") && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if !logHas(t, pc.c.LogPath(victim), "disk takes writes again") {
			t.Errorf("store %d did not take writes again within 30 s of its space returning; its log ends with:\n%s", victim, logTail(pc.c.LogPath(victim), 20))
		}
	} else {
		// Refused snapshots only: the leader sends another once the
		// space is back, and the replica check below finds the store
		// caught up (or fails).
		t.Logf("store %d met the full disk receiving a snapshot: %s", victim, logLine(t, pc.c.LogPath(victim), "receiving a snapshot failed"))
	}
	time.Sleep(time.Second)
	w.stop()
	pc.check("a full disk, a power cut while full, space back", w)
}

// logCount is how many lines of the file at path hold s.
func logCount(t *testing.T, path, s string) int {
	t.Helper()
	return len(logLines(t, path, s))
}

// logHas reports whether the file at path holds s.
func logHas(t *testing.T, path, s string) bool {
	t.Helper()
	return logCount(t, path, s) > 0
}

// logLine returns the first line of the file at path that holds s.
func logLine(t *testing.T, path, s string) string {
	t.Helper()
	if lines := logLines(t, path, s); len(lines) > 0 {
		return lines[0]
	}
	return ""
}

// logLines returns the lines of the file at path that hold s, trimmed.
func logLines(t *testing.T, path, s string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}
