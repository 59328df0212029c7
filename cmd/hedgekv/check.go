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
	var out outputFlag
	cmd := &cobra.Command{
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
regions it could not compare (exit 1). Run it on a quiet cluster.
-w json prints {"ok", "agreed": [...], "skipped_stores", "error"} instead.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				rep, err := replicacheck.Check(ctx, cli, 20*time.Millisecond)
				if asJSON {
					return writeCheckJSON(a, rep, err)
				}
				for _, ag := range rep.Agreed {
					fmt.Fprintf(a.stdout, "region %d: stores %v agree at applied index %d (%d keys)\n", ag.RegionID, ag.Stores, ag.AppliedIndex, ag.Keys)
				}
				if len(rep.SkippedStores) > 0 {
					fmt.Fprintf(a.stdout, "skipped stores %v: down\n", rep.SkippedStores)
				}
				if err != nil {
					// The answer is no (replicas disagree, or could not be
					// compared): exit 1, as ctl status's.
					fmt.Fprintf(a.stderr, "hedgekv: %s\n", describe(err))
					return silentError{exitNotFound}
				}
				fmt.Fprintf(a.stdout, "OK: the replicas of all %s agree\n", plural(len(rep.Agreed), "region", "regions"))
				return nil
			})
		}),
	}
	out.register(cmd)
	return cmd
}

type checkJSON struct {
	OK            bool            `json:"ok"`
	Agreed        []agreementJSON `json:"agreed"`
	SkippedStores []uint64        `json:"skipped_stores"`
	Error         string          `json:"error,omitempty"`
}

type agreementJSON struct {
	RegionID     uint64   `json:"region_id"`
	Stores       []uint64 `json:"stores"`
	AppliedIndex uint64   `json:"applied_index"`
	Keys         uint64   `json:"keys"`
}

// writeCheckJSON prints ctl check -w json; a failed check exits 1 all the
// same.
func writeCheckJSON(a *app, rep replicacheck.Report, err error) error {
	out := checkJSON{OK: err == nil, Agreed: []agreementJSON{}, SkippedStores: []uint64{}}
	for _, ag := range rep.Agreed {
		out.Agreed = append(out.Agreed, agreementJSON{RegionID: ag.RegionID, Stores: ag.Stores, AppliedIndex: ag.AppliedIndex, Keys: ag.Keys})
	}
	out.SkippedStores = append(out.SkippedStores, rep.SkippedStores...)
	if err != nil {
		out.Error = describe(err)
	}
	if werr := writeJSON(a.stdout, out); werr != nil {
		return werr
	}
	if err != nil {
		return silentError{exitNotFound}
	}
	return nil
}
