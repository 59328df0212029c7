package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// version is the release this binary is, when the build sets it
// (go build -ldflags "-X main.version=v1.2.3"); otherwise the module
// version Go stamped into the binary (a pseudo-version from the VCS, or
// "(devel)").
var version = ""

const (
	raftModule  = "go.etcd.io/raft/v3"
	bboltModule = "go.etcd.io/bbolt"
)

// buildVersion is what hedgekv version prints.
type buildVersion struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	CommitAt  string `json:"commit_time,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
	Raft      string `json:"etcd_raft"`
	Bbolt     string `json:"bbolt"`
}

// readVersion collects the version from the build information the Go
// toolchain embeds; what it does not hold is "unknown".
func readVersion() buildVersion {
	v := buildVersion{
		Version: version, Commit: "unknown", GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Raft: "unknown", Bbolt: "unknown",
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if v.Version == "" {
			v.Version = "unknown"
		}
		return v
	}
	if v.Version == "" {
		v.Version = bi.Main.Version
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitAt = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		switch d.Path {
		case raftModule:
			v.Raft = m.Version
		case bboltModule:
			v.Bbolt = m.Version
		}
	}
	return v
}

// versionString is the one-line form `hedgekv --version` prints.
func versionString() string {
	v := readVersion()
	commit := v.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if v.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("hedgekv %s (commit %s, %s, etcd raft %s, bbolt %s)", v.Version, commit, v.GoVersion, v.Raft, v.Bbolt)
}

func newVersionCmd(a *app) *cobra.Command {
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version and the etcd raft and bbolt versions",
		Args:  exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			v := readVersion()
			if asJSON {
				return writeJSON(a.stdout, v)
			}
			commit := v.Commit
			if v.Modified {
				commit += " (modified)"
			}
			if v.CommitAt != "" {
				commit += " " + v.CommitAt
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			for _, row := range [][2]string{
				{"hedgekv", v.Version}, {"commit", commit}, {"go", v.GoVersion + " " + v.Platform},
				{"etcd raft", raftModule + " " + v.Raft}, {"bbolt", bboltModule + " " + v.Bbolt},
			} {
				fmt.Fprintf(tw, "%s\t%s\n", row[0], strings.TrimSpace(row[1]))
			}
			return tw.Flush()
		}),
	}
	out.register(cmd)
	return cmd
}
