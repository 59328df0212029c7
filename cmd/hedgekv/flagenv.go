package main

// Every flag's default from the environment: --read from HEDGEKV_READ,
// --tls-cert from HEDGEKV_TLS_CERT, as etcdctl takes ETCDCTL_*, so that a
// shell session sets follower reads or its zone once.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagEnvPrefix starts the variable of every flag.
const flagEnvPrefix = "HEDGEKV_"

// flagEnvHelp is how the root's help says it.
const flagEnvHelp = `Every flag's default can be set in the environment: --read with HEDGEKV_READ,
--tls-cert with HEDGEKV_TLS_CERT (HEDGEKV_ and the name in capitals, dashes as
underscores); a flag given on the command line wins. The server and netsim
commands take none: scripts start them with their flags, and a shell's client
settings (its zone, its TLS files) must not leak into them.`

// flagEnvName is the variable that sets the flag name's default:
// HEDGEKV_MAX_STALENESS for max-staleness.
func flagEnvName(name string) string {
	return flagEnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagEnvExempt are the commands (with their subcommands) that take no
// flag from the environment: the processes scripts/cluster.sh and the
// benchmarks start with explicit flags, which would otherwise inherit the
// client settings of the shell they were started from.
var flagEnvExempt = []string{"server", "netsim"}

// applyFlagEnv sets the default of each flag of the command args name
// from its variable, before the command line is parsed, so that a flag
// given still wins and the help shows the default in force. A value the
// flag refuses is kept in a.flagEnvErrs, an error only if the flag is not
// given (flagEnvError).
func (a *app) applyFlagEnv(root *cobra.Command, args []string) {
	if a.getenv == nil {
		return
	}
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		return // cobra reports the unknown command
	}
	for c := cmd; c != nil && c != root; c = c.Parent() {
		if c.Parent() == root && slices.Contains(flagEnvExempt, c.Name()) {
			return
		}
	}
	a.flagEnv, a.flagEnvErrs = map[string]string{}, map[string]error{}
	apply := func(f *pflag.Flag) {
		if f.Name == "help" || f.Name == "version" || f.Hidden || f.Deprecated != "" {
			return // not settings; a hidden flag is an alias of another
		}
		name := flagEnvName(f.Name)
		v := a.getenv(name)
		if v == "" {
			return
		}
		var err error
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			// Replace, not Set: a repeatable flag given on the command line
			// then replaces the variable's value instead of adding to it.
			err = sv.Replace([]string{v})
		} else {
			err = f.Value.Set(v)
		}
		if err != nil {
			a.flagEnvErrs[f.Name] = fmt.Errorf("$%s=%q: %w", name, v, err)
			return
		}
		f.DefValue = f.Value.String()
		a.flagEnv[f.Name] = name
	}
	cmd.LocalFlags().VisitAll(apply)
	cmd.InheritedFlags().VisitAll(apply)
}

// flagEnvError is the first variable, in flag order, whose value its flag
// refused, unless the flag was given on the command line: a usage error.
func (a *app) flagEnvError(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if e, ok := a.flagEnvErrs[f.Name]; ok && !f.Changed && err == nil {
			err = usageError{e}
		}
	})
	return err
}

// flagGiven reports whether the root's persistent flag name was given on
// the command line (a variable only sets its default).
func (a *app) flagGiven(name string) bool {
	if a.root == nil {
		return false
	}
	f := a.root.PersistentFlags().Lookup(name)
	return f != nil && f.Changed
}
