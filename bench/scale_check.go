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
	st.res.Check = st.compareReplicas(ctx)
}

// compareReplicas is ctl check: every region's replicas compared.
func (st *scaleState) compareReplicas(ctx context.Context) ScaleCheck {
	st.prog.Printf("scale: checking that every region's replicas agree (ctl check)")
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	rep, err := replicacheck.Check(cctx, st.admin, 20*time.Millisecond)
	c := ScaleCheck{Agreed: len(rep.Agreed), Skipped: rep.SkippedStores}
	if err != nil {
		c.Err = err.Error()
		st.errorf("ctl check: %v", err)
		return c
	}
	st.prog.Printf("scale: the replicas of all %d regions agree", len(rep.Agreed))
	return c
}

func writeCheck(b *strings.Builder, c ScaleCheck) {
	b.WriteString("\n## Replicas agree (`ctl check`)\n\n")
	b.WriteString("After the restart:")
	writeCheckResult(b, c)
}

// writeCheckResult writes what one ctl check found, as a sentence.
func writeCheckResult(b *strings.Builder, c ScaleCheck) {
	if c.Err != "" {
		fmt.Fprintf(b, " **failed**: %s (%d regions agreed before it).\n", inlineCode(c.Err), c.Agreed)
		return
	}
	fmt.Fprintf(b, " every region's replicas compared at one applied index: **the replicas of all %d regions agree**", c.Agreed)
	if len(c.Skipped) > 0 {
		fmt.Fprintf(b, " (stores %v down, not compared)", c.Skipped)
	}
	b.WriteString(".\n")
}
