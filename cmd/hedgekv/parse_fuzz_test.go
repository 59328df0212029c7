package main

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// FuzzParseFault: ctl fault's SPEC. Any string gives a fault or a usage
// error, never a panic; an accepted fault is one the server's Fault call
// accepts (server/faults.go checkFaultRequest): no negative duration, a
// probability in (0, 1] exactly when there is a delay, and something to do.
func FuzzParseFault(f *testing.F) {
	for _, s := range []string{"delay=200ms,prob=0.5", "delay=1s", "stall=3s", "clear", "clear,stall=1s", "prob=0.5",
		"delay=0s", "delay=-1ms", "prob=NaN,delay=1ms", "prob=1.0000001,delay=1ms", "delay=1ms,delay=2ms", "clear=1",
		"", " , ", "delay", "=", "delay=9223372036854775807ns,prob=1e-300", "stall=2562047h47m16.854775807s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		fault, err := parseFault(spec)
		if err != nil {
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("parseFault(%q) = %v, not a usage error", spec, err)
			}
			return
		}
		switch {
		case fault.Delay < 0 || fault.Stall < 0:
			t.Fatalf("parseFault(%q) = negative duration %+v", spec, fault)
		case fault.Delay > 0 && !(fault.Prob > 0 && fault.Prob <= 1):
			t.Fatalf("parseFault(%q) = delay with probability %v", spec, fault.Prob)
		case fault.Delay == 0 && fault.Prob != 0:
			t.Fatalf("parseFault(%q) = probability %v without a delay", spec, fault.Prob)
		case !fault.Clear && fault.Delay == 0 && fault.Stall == 0:
			t.Fatalf("parseFault(%q) = nothing to do", spec)
		}
	})
}

// FuzzParseAddrLists: --peers, --upstream and --advertise-zone-addrs.
func FuzzParseAddrLists(f *testing.F) {
	for _, s := range []string{"1=127.0.0.1:20160,2=127.0.0.1:20161", "1=h:1, 2 = h:2 ", "0=h:1", "1=h:1,1=h:2", "1=", "=h:1",
		"18446744073709551616=h:1", "dc-a=10.0.0.1:20160,dc-b=[::1]:1", "dc-a=:1", "dc-a=0.0.0.0:1", "a=h:1,a=h:2", "", ","} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if peers, err := parsePeers(s); err == nil {
			for id, addr := range peers {
				if id == 0 || addr == "" || addr != strings.TrimSpace(addr) {
					t.Fatalf("parsePeers(%q): %d=%q", s, id, addr)
				}
			}
		}
		if up, err := parseUpstream(s); err == nil {
			for id, addr := range up {
				if _, _, herr := net.SplitHostPort(addr); id == 0 || herr != nil {
					t.Fatalf("parseUpstream(%q): %d=%q", s, id, addr)
				}
			}
		}
		if za, err := parseZoneAddrs(s); err == nil {
			for zone, addr := range za {
				host, port, herr := net.SplitHostPort(addr)
				if zone == "" || herr != nil || host == "" || port == "" {
					t.Fatalf("parseZoneAddrs(%q): %q=%q", s, zone, addr)
				}
			}
		}
	})
}
