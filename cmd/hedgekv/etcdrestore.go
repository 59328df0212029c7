package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/server/etcdapi"
)

func newEtcdRestoreCmd(a *app) *cobra.Command {
	var (
		from        string
		opts        etcdapi.RestoreOptions
		stepTimeout time.Duration
		check       bool
	)
	cmd := &cobra.Command{
		Use:   "etcd-restore --from SNAP.db [--endpoints ...] [--skip-hash-check] [--drop-leases] [--check]",
		Short: "Load an etcd snapshot (etcdctl snapshot save) into a new cluster's etcd keyspace",
		Long: `Load an etcd snapshot into the etcd keyspace of a new cluster (the one at
--endpoints): every key with its value, create and mod revisions and version,
the history from the snapshot's compaction revision on, and the revision
itself, so clients carry on at the snapshot's revision. The file is what
etcdctl snapshot save wrote, from hedgekv or from an etcd member; its sha256
trailer is checked (--skip-hash-check for an etcd data directory's
member/snap/db, which has none).

The keyspace must be empty: a restore into one that holds anything, even a
lease, is refused. While the restore runs, the keyspace refuses reads and
writes (Unavailable). Run it again with the same file to resume one that
was interrupted; run after it finished, it says so and changes nothing.

Leases are not carried: a snapshot that holds leases or keys attached to one
is refused unless --drop-leases, which restores those keys without their
lease. --check only reads the file and says what it holds.

--timeout, if given, bounds the whole restore; each step (a batch of
records, about --batch-bytes) must be answered within --step-timeout.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if from == "" {
				return usagef("--from names no snapshot file")
			}
			if check {
				info, err := etcdapi.ReadSnapshotInfo(from, opts.SkipHashCheck)
				if err != nil {
					return usageError{err} // bad input
				}
				fmt.Fprintf(a.stdout, "%s: revision %d, compaction %s, %d history records, %d leases (%d records attached to one), sha256 %x%s\n",
					from, info.Revision, compaction(info.CompactRevision), info.Entries, info.Leases, info.LeasedEntries, info.SHA256,
					map[bool]string{true: "", false: " (no trailer)"}[info.HasHash])
				return nil
			}
			if stepTimeout <= 0 {
				return usagef("--step-timeout must be positive, got %v", stepTimeout)
			}
			opts.CallTimeout = stepTimeout
			eps, err := a.endpointList()
			if err != nil {
				return err
			}
			tlsCfg, err := a.clientTLS()
			if err != nil {
				return err
			}
			creds := insecure.NewCredentials()
			if tlsCfg != nil {
				creds = credentials.NewTLS(tlsCfg)
			}
			var conns []grpc.ClientConnInterface
			for _, ep := range eps {
				conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(creds))
				if err != nil {
					return usagef("endpoint %s: %v", ep, err)
				}
				defer conn.Close()
				conns = append(conns, conn)
			}
			ctx := cmd.Context()
			if cmd.Flags().Changed("timeout") {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, a.timeout)
				defer cancel()
			}
			res, err := etcdapi.RestoreSnapshot(ctx, conns, from, opts)
			if errors.Is(err, etcdapi.ErrSnapshotFile) {
				return usageError{err} // bad input
			}
			if err != nil {
				if cause, ok := unreachable(err); ok && !strings.Contains(status.Convert(err).Message(), "etcdserver") && res.Entries == 0 {
					return unreachableError{endpoints: eps, cause: cause}
				}
				return err
			}
			if res.AlreadyRestored {
				fmt.Fprintf(a.stdout, "%s was restored into this keyspace already (revision %d): nothing to do\n", from, res.Revision)
				return nil
			}
			fmt.Fprintf(a.stdout, "restored %s: revision %d, compaction %s, %d history records, %d keys", from, res.Revision, compaction(res.CompactRevision), res.Entries, res.Keys)
			if res.LeasedKeys > 0 {
				fmt.Fprintf(a.stdout, " (%d records detached from their lease)", res.LeasedKeys)
			}
			fmt.Fprintln(a.stdout)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "the snapshot `FILE` (etcdctl snapshot save's)")
	f.BoolVar(&opts.SkipHashCheck, "skip-hash-check", false, "restore a file without the sha256 trailer (an etcd data directory's member/snap/db)")
	f.BoolVar(&opts.DropLeases, "drop-leases", false, "restore keys attached to leases without their lease (else such a snapshot is refused)")
	f.IntVar(&opts.BatchBytes, "batch-bytes", 1<<20, "bytes of records per step (one raft log entry); a larger record goes alone")
	f.DurationVar(&stepTimeout, "step-timeout", 30*time.Second, "deadline of each step; a step that times out or finds no leader is sent again (steps are idempotent)")
	f.BoolVar(&check, "check", false, "only check the file and print what it holds; restore nothing")
	return cmd
}

func compaction(rev int64) string {
	if rev < 0 {
		return "none"
	}
	return fmt.Sprint(rev)
}
