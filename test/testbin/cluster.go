package testbin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Result is what one process invocation produced.
type Result struct {
	Stdout, Stderr string
	Err            error
	Elapsed        time.Duration
}

func (r Result) String() string {
	return fmt.Sprintf("err=%v (%v)\nstdout:\n%s\nstderr:\n%s", r.Err, r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
}

// Run executes name args... in dir with env, bounded by timeout.
func Run(dir string, timeout time.Duration, env []string, name string, args ...string) Result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return Result{stdout.String(), stderr.String(), err, time.Since(start)}
}

// Ports of a three-store cluster behind scripts/cluster.sh --topology. A
// cluster takes one block of BlockSize ports at a random base B below the
// kernel's ephemeral range, so that no port the kernel hands out meanwhile
// (a netsim proxy on a free port, an outgoing connection's local port)
// can take one of them between the moment the block is found free and the
// moment its process binds it:
//
//	B+1..B+3     the stores' gRPC      B+11..B+13   their status HTTP
//	B+99         the netsim's control  B+101..B+303 its proxies (NETSIM_PORT_BASE=B)
const (
	BlockSize = 400
	blockLow  = 10000
)

// Block is one block of ports.
type Block struct {
	Base        int
	GRPC        []int
	Status      []int
	Control     int
	Proxies     []int
	GRPCAddrs   []string // 127.0.0.1:port of each store
	StatusAddrs []string
}

func blockAt(base int) Block {
	b := Block{Base: base, Control: base + 99}
	for s := 1; s <= 3; s++ {
		b.GRPC = append(b.GRPC, base+s)
		b.Status = append(b.Status, base+10+s)
		b.GRPCAddrs = append(b.GRPCAddrs, fmt.Sprintf("127.0.0.1:%d", base+s))
		b.StatusAddrs = append(b.StatusAddrs, fmt.Sprintf("127.0.0.1:%d", base+10+s))
		for zone := 1; zone <= 3; zone++ {
			b.Proxies = append(b.Proxies, base+100*zone+s)
		}
	}
	return b
}

// Env is the cluster.sh environment that puts a cluster on this block.
func (b Block) Env() []string {
	return []string{
		"GRPC_PORTS=" + JoinInts(b.GRPC),
		"STATUS_PORTS=" + JoinInts(b.Status),
		"NETSIM_PORT_BASE=" + strconv.Itoa(b.Base),
		"NETSIM_CONTROL=" + fmt.Sprintf("127.0.0.1:%d", b.Control),
	}
}

// ephemeralLow is where the kernel's ephemeral ports start.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > blockLow+BlockSize {
				return v
			}
		}
	}
	return 32768
}

// FreeBlock returns a block whose every port was free on 127.0.0.1 a moment
// ago. Blocks that overlap the local cluster's default ports (20160-20183,
// netsim 21000-21999) are never chosen.
func FreeBlock() (Block, error) {
	slots := (ephemeralLow() - blockLow) / BlockSize
	for range 100 {
		base := blockLow + rand.IntN(slots)*BlockSize
		if base < 22000 && base+BlockSize > 20000 {
			continue
		}
		b := blockAt(base)
		if allFree(slices.Concat(b.GRPC, b.Status, []int{b.Control}, b.Proxies)) {
			return b, nil
		}
	}
	return Block{}, errors.New("no free block of ports found below the ephemeral range")
}

func allFree(ports []int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, p := range ports {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// JoinInts joins xs with commas.
func JoinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// FreePorts returns n distinct ports, below the kernel's ephemeral range,
// that were free on 127.0.0.1 a moment ago. Below that range no outgoing
// connection's local port can take one of them between the moment it is
// found free and the moment a store binds it, or while a killed store is
// down before its restart (a port the kernel handed out could be).
func FreePorts(n int) ([]int, error) {
	low := ephemeralLow()
	for range 100 {
		base := blockLow + rand.IntN(low-blockLow-n)
		if base < 22000 && base+n > 20000 {
			continue // the local cluster's default ports and netsim's
		}
		ports := make([]int, n)
		for i := range ports {
			ports[i] = base + i
		}
		if allFree(ports) {
			return ports, nil
		}
	}
	return nil, errors.New("no free run of ports found below the ephemeral range")
}

// Addrs turns ports into 127.0.0.1:port addresses.
func Addrs(ports []int) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return out
}

// ClusterScript runs scripts/cluster.sh args... of the repository at root
// with env, bounded by timeout.
func ClusterScript(root string, timeout time.Duration, env []string, args ...string) Result {
	return Run(root, timeout, env, "bash", append([]string{filepath.Join(root, "scripts", "cluster.sh")}, args...)...)
}
