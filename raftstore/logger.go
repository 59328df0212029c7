package raftstore

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// raftLogger routes etcd-io/raft's logging into slog. Raft's Info level is
// chatty (every election step), so it goes to Debug.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)                 { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Info(v ...any)                  { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any)  { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...any)               { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.l.Warn(fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any)                 { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Fatal(v ...any)                 { r.fatal(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(format string, v ...any) { r.fatal(fmt.Sprintf(format, v...)) }
func (r raftLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }

// fatal: raft calls Fatal only on broken invariants (corrupt log); continuing
// could acknowledge lost writes.
func (r raftLogger) fatal(msg string) {
	r.l.Log(context.Background(), slog.LevelError, "raft fatal: "+msg)
	os.Exit(1)
}
