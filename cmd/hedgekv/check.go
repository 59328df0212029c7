package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/replicacheck"
)

func newCtlCheckCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Check that every region's replicas agree",
		Long: `Check that every region's replicas agree.

Every store hosting a replica of a region is asked for its digest (the
region's data, metadata and live dedup records at one applied index); once
a region's replicas are at the same applied index their digests are
compared. A disagreement names the region, the stores on each side and the
first key they differ on, and exits 1. Stores that are down are skipped
and listed. Under a steady write load replicas may never be at one applied
index together: the check then gives up at --timeout and says which
regions it could not compare (exit 1). Run it on a quiet cluster.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				rep, err := replicacheck.Check(ctx, cli, 20*time.Millisecond)
				for _, ag := range rep.Agreed {
					fmt.Fprintf(a.stdout, "region %d: stores %v agree at applied index %d (%d keys)\n", ag.RegionID, ag.Stores, ag.AppliedIndex, ag.Keys)
				}
				if len(rep.SkippedStores) > 0 {
					fmt.Fprintf(a.stdout, "skipped stores %v: down\n", rep.SkippedStores)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "OK: the replicas of all %d regions agree\n", len(rep.Agreed))
				return nil
			})
		}),
	}
}
