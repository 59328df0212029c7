package engine

import (
	"strings"
	"testing"
)

// A data dir another process (here: another open of the same file) holds
// is reported as in use, not as bbolt's bare "timeout".
func TestOpenEngineDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = openEngine(dir, true)
	if err == nil || !strings.Contains(err.Error(), "data dir "+dir+" is in use by another hedgekv process") {
		t.Fatalf("second open: %v, want the data dir named as in use", err)
	}
}
