package testbin

import (
	"encoding/json"
	"fmt"
	"strings"
)

// What `hedgekv ctl regions --json` and `ctl stores --json` print, as the
// multi-process tests read it.

// PeerJSON is a replica of a region.
type PeerJSON struct {
	ID        uint64 `json:"id"`
	StoreID   uint64 `json:"store_id"`
	IsLearner bool   `json:"is_learner"`
}

// RegionJSON is a region of ctl regions.
type RegionJSON struct {
	ID            uint64     `json:"id"`
	StartKey      string     `json:"start_key"`
	EndKey        string     `json:"end_key"`
	Peers         []PeerJSON `json:"peers"`
	LeaderStoreID uint64     `json:"leader_store_id"`
}

func (r RegionJSON) String() string {
	ps := make([]string, len(r.Peers))
	for i, p := range r.Peers {
		ps[i] = fmt.Sprintf("%d@%d", p.ID, p.StoreID)
		if p.IsLearner {
			ps[i] += "(L)"
		}
	}
	return fmt.Sprintf("region %d [%q,%q) peers %s leader %d", r.ID, r.StartKey, r.EndKey, strings.Join(ps, ","), r.LeaderStoreID)
}

// StoreJSON is a store of ctl stores.
type StoreJSON struct {
	ID          uint64 `json:"id"`
	Address     string `json:"address"`
	Zone        string `json:"zone"`
	Up          bool   `json:"up"`
	LeaderCount uint64 `json:"leader_count"`
	RegionCount uint64 `json:"region_count"`
	Removing    bool   `json:"removing"`
	Removed     bool   `json:"removed"`
}

// DecodeJSON decodes into out what the CLI command cmd (for the errors)
// printed in JSON, as r.
func DecodeJSON(r Result, cmd string, out any) error {
	if r.Err != nil {
		return fmt.Errorf("%s: %v", cmd, r)
	}
	if err := json.Unmarshal([]byte(r.Stdout), out); err != nil {
		return fmt.Errorf("%s: %v in %q", cmd, err, r.Stdout)
	}
	return nil
}
