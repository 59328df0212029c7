package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hedgekv/hedgekv/replicacheck"
)

// ScaleCheck is `ctl check` at the end of the run: every region's replicas
// compared at one applied index, once the load, the move and the restart
// are over.
type ScaleCheck struct {
	Agreed  int      `json:"regions_agreed"`
	Skipped []uint64 `json:"skipped_stores,omitempty"` // down: not compared
	Err     string   `json:"error,omitempty"`
}

// checkTimeout bounds the check: with no load running, replicas reach one
// applied index within a round or two.
const checkTimeout = 2 * time.Minute

// checkReplicas runs what `ctl check` runs.
func (st *scaleState) checkReplicas(ctx context.Context) {
	st.prog.Printf("scale: checking that every region's replicas agree (ctl check)")
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	rep, err := replicacheck.Check(cctx, st.admin, 20*time.Millisecond)
	st.res.Check = ScaleCheck{Agreed: len(rep.Agreed), Skipped: rep.SkippedStores}
	if err != nil {
		st.res.Check.Err = err.Error()
		st.errorf("ctl check: %v", err)
		return
	}
	st.prog.Printf("scale: the replicas of all %d regions agree", len(rep.Agreed))
}

func writeCheck(b *strings.Builder, c ScaleCheck) {
	b.WriteString("\n## Replicas agree (`ctl check`)\n\n")
	if c.Err != "" {
		fmt.Fprintf(b, "**Failed**: %s (%d regions agreed before it).\n", inlineCode(c.Err), c.Agreed)
		return
	}
	fmt.Fprintf(b, "Every region's replicas compared at one applied index after the restart: **the replicas of all %d regions agree**", c.Agreed)
	if len(c.Skipped) > 0 {
		fmt.Fprintf(b, " (stores %v down, not compared)", c.Skipped)
	}
	b.WriteString(".\n")
}
