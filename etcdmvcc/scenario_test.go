package etcdmvcc

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestScenarios runs testdata/scenarios in etcd raft's data-driven style
// (go test -run TestScenarios -rewrite regenerates the expectations). A
// scenario is a MemStore at revision 1, as a new etcd, and commands:
//
//	apply              the request in the input: CheckRequest, then Apply at
//	                   the next revision and Commit; prints the response, the
//	                   header revision and the events
//	apply-unchecked    the same without CheckRequest
//	check              CheckRequest alone (max-ops=N sets maxTxnOps)
//	read               a top-level range: ReadRev, then Range
//	compact rev=N      CheckCompact, then MemStore.Compact
//	history            every history record
//	grant lease=N      a lease LeaseExists knows
//
// A request is written one operation per line, a Txn's parts indented:
//
//	put KEY [VALUE] [lease=N] [prev-kv] [ignore-value] [ignore-lease]
//	del KEY [END] [prev-kv]
//	range KEY [END] [rev=N] [limit=N] [sort=TARGET[,ORDER]] [keys-only]
//	      [count-only] [min-mod=N] [max-mod=N] [min-create=N] [max-create=N]
//	txn
//	  if TARGET(KEY[,END]) OP VALUE       TARGET: value version create mod lease
//	  then                                OP: = != > <
//	    OPERATION...
//	  else
//	    OPERATION...
//
// Words may be Go-quoted ("a\x00b"); END "\0" is etcd's "\x00", every key
// from KEY on.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		s := &scenario{ms: NewMemStore(), rev: 1}
		datadriven.RunTest(t, path, s.run)
	})
}

type scenario struct {
	ms  *MemStore
	rev int64
}

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "apply", "apply-unchecked":
		req := parseRequest(t, d.Input)
		if d.Cmd == "apply" {
			if err := CheckRequest(req, DefaultMaxTxnOps); err != nil {
				return "check: " + err.Error() + "\n"
			}
		}
		resp, writes, events, err := Apply(s.ms, s.rev+1, req)
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		if len(writes) != len(events) {
			t.Fatalf("%d writes, %d events", len(writes), len(events))
		}
		if len(writes) > 0 {
			s.rev++
			if err := Commit(s.ms, writes); err != nil {
				t.Fatal(err)
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "header: %d\n", s.rev)
		fmtResponse(&b, "", resp)
		for i, ev := range events {
			if ev.Rev != writes[i].Rev || ev.Rev.Main != s.rev || ev.Rev.Sub != int64(i) {
				t.Fatalf("event %d at %v, write at %v, revision %d", i, ev.Rev, writes[i].Rev, s.rev)
			}
			fmt.Fprintf(&b, "event %v %s\n", ev.Rev, fmtEvent(ev.Event))
		}
		return b.String()
	case "check":
		maxOps := DefaultMaxTxnOps
		if d.HasArg("max-ops") {
			d.ScanArgs(t, "max-ops", &maxOps)
		}
		if err := CheckRequest(parseRequest(t, d.Input), maxOps); err != nil {
			return err.Error() + "\n"
		}
		return "ok\n"
	case "read":
		rr := parseRequest(t, d.Input).GetRequestRange()
		if rr == nil {
			t.Fatal("read takes a range")
		}
		if err := CheckRequest(&pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: rr}}, DefaultMaxTxnOps); err != nil {
			return "check: " + err.Error() + "\n"
		}
		atRev, err := ReadRev(rr.Revision, s.ms.CompactRev(), s.rev)
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		resp, err := Range(s.ms, rr, atRev)
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		var b strings.Builder
		fmt.Fprintf(&b, "header: %d\n", s.rev)
		fmtRange(&b, "", resp)
		return b.String()
	case "compact":
		var rev int64
		d.ScanArgs(t, "rev", &rev)
		if err := CheckCompact(rev, s.ms.CompactRev(), s.rev); err != nil {
			return "error: " + err.Error() + "\n"
		}
		if err := s.ms.Compact(rev); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("compacted at %d, %d history records left\n", rev, s.ms.HistoryLen())
	case "history":
		var b strings.Builder
		s.ms.hist.Ascend(func(it histItem) bool {
			fmt.Fprintf(&b, "%s %v %s", word(it.key), it.rev, it.rec.Kind)
			if it.rec.Kind == KindPut {
				fmt.Fprintf(&b, " %s c%d v%d", word(it.rec.Value), it.rec.CreateRev, it.rec.Version)
				if it.rec.Lease != 0 {
					fmt.Fprintf(&b, " l%d", it.rec.Lease)
				}
			}
			b.WriteString("\n")
			return true
		})
		return b.String()
	case "grant":
		var id int64
		d.ScanArgs(t, "lease", &id)
		s.ms.GrantLease(id)
		return ""
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

// parseRequest reads the request language of TestScenarios.
func parseRequest(t *testing.T, input string) *pb.RequestOp {
	t.Helper()
	p := &reqParser{t: t, lines: strings.Split(strings.TrimRight(input, "\n"), "\n")}
	ops := p.ops(0)
	if len(ops) != 1 || p.i != len(p.lines) {
		t.Fatalf("want one request, got %d operations in:\n%s", len(ops), input)
	}
	return ops[0]
}

type reqParser struct {
	t     *testing.T
	lines []string
	i     int
}

func indentOf(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }

// ops reads the operations at this indent.
func (p *reqParser) ops(indent int) []*pb.RequestOp {
	var out []*pb.RequestOp
	for p.i < len(p.lines) && indentOf(p.lines[p.i]) == indent {
		words := p.words(p.lines[p.i])
		if w := words[0]; w == "if" || w == "then" || w == "else" {
			break
		}
		p.i++
		out = append(out, p.op(words, indent))
	}
	return out
}

func (p *reqParser) op(words []string, indent int) *pb.RequestOp {
	t := p.t
	args, flags := map[string]string{}, map[string]bool{}
	var pos []string
	for _, w := range words[1:] {
		k, v, _ := strings.Cut(w, "=")
		switch {
		case opFlags[w]:
			flags[w] = true
		case opArgs[k]:
			args[k] = v
		default:
			pos = append(pos, w)
		}
	}
	key := func(i int) []byte {
		if i >= len(pos) {
			return nil
		}
		if pos[i] == `\0` {
			return []byte{0}
		}
		return []byte(pos[i])
	}
	num := func(name string) int64 {
		v, ok := args[name]
		if !ok {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%s: %v", name, v, err)
		}
		return n
	}
	switch words[0] {
	case "put":
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
			Key: key(0), Value: key(1), Lease: num("lease"),
			PrevKv: flags["prev-kv"], IgnoreValue: flags["ignore-value"], IgnoreLease: flags["ignore-lease"],
		}}}
	case "del":
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{
			Key: key(0), RangeEnd: key(1), PrevKv: flags["prev-kv"],
		}}}
	case "range":
		r := &pb.RangeRequest{
			Key: key(0), RangeEnd: key(1), Revision: num("rev"), Limit: num("limit"),
			KeysOnly: flags["keys-only"], CountOnly: flags["count-only"],
			MinModRevision: num("min-mod"), MaxModRevision: num("max-mod"),
			MinCreateRevision: num("min-create"), MaxCreateRevision: num("max-create"),
		}
		if v, ok := args["sort"]; ok {
			target, order, _ := strings.Cut(v, ",")
			r.SortTarget = pb.RangeRequest_SortTarget(enumValue(t, pb.RangeRequest_SortTarget_value, target))
			if order != "" {
				r.SortOrder = pb.RangeRequest_SortOrder(enumValue(t, pb.RangeRequest_SortOrder_value, order))
			}
		}
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
	case "txn":
		txn := &pb.TxnRequest{}
		for p.i < len(p.lines) && indentOf(p.lines[p.i]) == indent+2 {
			w := p.words(p.lines[p.i])
			p.i++
			switch w[0] {
			case "if":
				txn.Compare = append(txn.Compare, p.compare(w[1:]))
			case "then":
				txn.Success = append(txn.Success, p.ops(indent+4)...)
			case "else":
				txn.Failure = append(txn.Failure, p.ops(indent+4)...)
			default:
				t.Fatalf("in a txn: %q", p.lines[p.i-1])
			}
		}
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: txn}}
	case "empty":
		return &pb.RequestOp{}
	}
	t.Fatalf("unknown operation %q", words[0])
	return nil
}

var (
	opFlags = map[string]bool{"prev-kv": true, "ignore-value": true, "ignore-lease": true, "keys-only": true, "count-only": true}
	opArgs  = map[string]bool{"lease": true, "rev": true, "limit": true, "sort": true, "min-mod": true, "max-mod": true, "min-create": true, "max-create": true}
)

// compare reads TARGET(KEY[,END]) OP VALUE.
func (p *reqParser) compare(w []string) *pb.Compare {
	t := p.t
	if len(w) != 3 {
		t.Fatalf("compare %q: want TARGET(KEY[,END]) OP VALUE", w)
	}
	target, rest, ok := strings.Cut(w[0], "(")
	if !ok || !strings.HasSuffix(rest, ")") {
		t.Fatalf("compare %q", w[0])
	}
	k, end, _ := strings.Cut(strings.TrimSuffix(rest, ")"), ",")
	c := &pb.Compare{Key: []byte(unquote(t, k))}
	if end == `\0` {
		c.RangeEnd = []byte{0}
	} else if end != "" {
		c.RangeEnd = []byte(unquote(t, end))
	}
	c.Result = map[string]pb.Compare_CompareResult{"=": pb.Compare_EQUAL, "!=": pb.Compare_NOT_EQUAL, ">": pb.Compare_GREATER, "<": pb.Compare_LESS}[w[1]]
	n, _ := strconv.ParseInt(w[2], 10, 64)
	switch target {
	case "value":
		c.Target, c.TargetUnion = pb.Compare_VALUE, &pb.Compare_Value{Value: []byte(unquote(t, w[2]))}
	case "version":
		c.Target, c.TargetUnion = pb.Compare_VERSION, &pb.Compare_Version{Version: n}
	case "create":
		c.Target, c.TargetUnion = pb.Compare_CREATE, &pb.Compare_CreateRevision{CreateRevision: n}
	case "mod":
		c.Target, c.TargetUnion = pb.Compare_MOD, &pb.Compare_ModRevision{ModRevision: n}
	case "lease":
		c.Target, c.TargetUnion = pb.Compare_LEASE, &pb.Compare_Lease{Lease: n}
	default:
		t.Fatalf("compare target %q", target)
	}
	return c
}

// words splits a line on spaces, keeping Go-quoted words whole (unquoted).
func (p *reqParser) words(line string) []string {
	var out []string
	rest := strings.TrimSpace(line)
	for rest != "" {
		var w string
		if rest[0] == '"' {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				p.t.Fatalf("%q: %v", line, err)
			}
			w, rest = unquote(p.t, q), rest[len(q):]
		} else {
			w, rest, _ = strings.Cut(rest, " ")
		}
		out = append(out, w)
		rest = strings.TrimLeft(rest, " ")
	}
	return out
}

func unquote(t *testing.T, s string) string {
	if !strings.HasPrefix(s, `"`) {
		return s
	}
	u, err := strconv.Unquote(s)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return u
}

func enumValue(t *testing.T, values map[string]int32, name string) int32 {
	if v, ok := values[strings.ToUpper(name)]; ok {
		return v
	}
	n, err := strconv.ParseInt(name, 10, 32) // an out-of-enum number
	if err != nil {
		t.Fatalf("enum %q", name)
	}
	return int32(n)
}

// word prints a key or value: bare when plain, else Go-quoted.
func word(b []byte) string {
	s := string(b)
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || r == '"' || r == '=' {
			return strconv.Quote(s)
		}
	}
	return s
}

func fmtKV(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return "<nil>"
	}
	s := fmt.Sprintf("%s=%s c%d m%d v%d", word(kv.Key), word(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version)
	if kv.Lease != 0 {
		s += fmt.Sprintf(" l%d", kv.Lease)
	}
	return s
}

func fmtEvent(ev *mvccpb.Event) string {
	s := ev.Type.String() + " " + fmtKV(ev.Kv)
	if ev.PrevKv != nil {
		s += " prev " + fmtKV(ev.PrevKv)
	}
	return s
}

func fmtHeader(h *pb.ResponseHeader) string {
	if h == nil {
		return "-"
	}
	return strconv.FormatInt(h.Revision, 10)
}

func fmtRange(b *strings.Builder, indent string, r *pb.RangeResponse) {
	fmt.Fprintf(b, "%srange: header %s count %d", indent, fmtHeader(r.Header), r.Count)
	if r.More {
		b.WriteString(" more")
	}
	b.WriteString("\n")
	for _, kv := range r.Kvs {
		fmt.Fprintf(b, "%s  %s\n", indent, fmtKV(kv))
	}
}

func fmtResponse(b *strings.Builder, indent string, r *pb.ResponseOp) {
	switch v := r.Response.(type) {
	case *pb.ResponseOp_ResponseRange:
		fmtRange(b, indent, v.ResponseRange)
	case *pb.ResponseOp_ResponsePut:
		fmt.Fprintf(b, "%sput: header %s", indent, fmtHeader(v.ResponsePut.Header))
		if v.ResponsePut.PrevKv != nil {
			fmt.Fprintf(b, " prev %s", fmtKV(v.ResponsePut.PrevKv))
		}
		b.WriteString("\n")
	case *pb.ResponseOp_ResponseDeleteRange:
		fmt.Fprintf(b, "%sdel: header %s deleted %d\n", indent, fmtHeader(v.ResponseDeleteRange.Header), v.ResponseDeleteRange.Deleted)
		for _, kv := range v.ResponseDeleteRange.PrevKvs {
			fmt.Fprintf(b, "%s  prev %s\n", indent, fmtKV(kv))
		}
	case *pb.ResponseOp_ResponseTxn:
		tr := v.ResponseTxn
		branch := "else"
		if tr.Succeeded {
			branch = "then"
		}
		fmt.Fprintf(b, "%stxn: header %s %s\n", indent, fmtHeader(tr.Header), branch)
		for _, op := range tr.Responses {
			fmtResponse(b, indent+"  ", op)
		}
	default:
		fmt.Fprintf(b, "%s<empty>\n", indent)
	}
}
