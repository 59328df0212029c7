package etcdapi

import (
	"bytes"
	"math/rand/v2"
)

// watchIndex finds the synced watchers of a key: an exact-key map for the
// watchers of one key (most of them), and for those of a range an
// interval treap ordered by (start, seq), each node holding the largest
// end below it, so the ranges holding a key are found in O(log n + k)
// and a watcher joins or leaves in O(log n), whatever the churn.
type watchIndex struct {
	exact  map[string][]*watcher
	ranges *rangeNode
	n      int
}

func newWatchIndex() *watchIndex { return &watchIndex{exact: map[string][]*watcher{}} }

func (x *watchIndex) add(w *watcher) {
	x.n++
	if w.single {
		x.exact[string(w.start)] = append(x.exact[string(w.start)], w)
		return
	}
	x.ranges = x.ranges.insert(&rangeNode{w: w, prio: rand.Uint64()})
}

func (x *watchIndex) remove(w *watcher) {
	x.n--
	if w.single {
		ws := x.exact[string(w.start)]
		for i, o := range ws {
			if o == w {
				ws[i] = ws[len(ws)-1]
				ws[len(ws)-1] = nil
				ws = ws[:len(ws)-1]
				break
			}
		}
		if len(ws) == 0 {
			delete(x.exact, string(w.start))
		} else {
			x.exact[string(w.start)] = ws
		}
		return
	}
	x.ranges = x.ranges.delete(w)
}

// match appends to out the watchers whose key or range holds key.
func (x *watchIndex) match(key []byte, out []*watcher) []*watcher {
	out = append(out, x.exact[string(key)]...)
	return x.ranges.stab(key, out)
}

// each calls fn for every watcher in the index.
func (x *watchIndex) each(fn func(*watcher)) {
	for _, ws := range x.exact {
		for _, w := range ws {
			fn(w)
		}
	}
	x.ranges.each(fn)
}

// rangeNode is a watcher of a range [w.start, w.end) (end nil: no
// bound) in the treap.
type rangeNode struct {
	w           *watcher
	prio        uint64
	maxEnd      []byte // the largest end in this subtree
	unbounded   bool   // some range in this subtree has no end
	left, right *rangeNode
}

func (n *rangeNode) less(o *watcher) bool {
	if c := bytes.Compare(n.w.start, o.start); c != 0 {
		return c < 0
	}
	return n.w.seq < o.seq
}

// fix recomputes n's subtree maximum from its own range and children.
func (n *rangeNode) fix() {
	n.maxEnd, n.unbounded = n.w.end, n.w.end == nil
	for _, c := range [2]*rangeNode{n.left, n.right} {
		if c == nil {
			continue
		}
		if c.unbounded {
			n.unbounded = true
		} else if bytes.Compare(c.maxEnd, n.maxEnd) > 0 {
			n.maxEnd = c.maxEnd
		}
	}
}

func (n *rangeNode) insert(m *rangeNode) *rangeNode {
	if n == nil {
		m.fix()
		return m
	}
	if m.less(n.w) {
		n.left = n.left.insert(m)
		if n.left.prio > n.prio {
			n = n.rotateRight()
		}
	} else {
		n.right = n.right.insert(m)
		if n.right.prio > n.prio {
			n = n.rotateLeft()
		}
	}
	n.fix()
	return n
}

func (n *rangeNode) delete(w *watcher) *rangeNode {
	if n == nil {
		return nil
	}
	switch {
	case n.w == w:
		switch {
		case n.left == nil:
			return n.right
		case n.right == nil:
			return n.left
		case n.left.prio > n.right.prio:
			n = n.rotateRight()
			n.right = n.right.delete(w)
		default:
			n = n.rotateLeft()
			n.left = n.left.delete(w)
		}
	case (&rangeNode{w: w}).less(n.w):
		n.left = n.left.delete(w)
	default:
		n.right = n.right.delete(w)
	}
	n.fix()
	return n
}

func (n *rangeNode) rotateRight() *rangeNode {
	l := n.left
	n.left, l.right = l.right, n
	n.fix()
	l.fix()
	return l
}

func (n *rangeNode) rotateLeft() *rangeNode {
	r := n.right
	n.right, r.left = r.left, n
	n.fix()
	r.fix()
	return r
}

// stab appends the watchers of the ranges under n that hold key.
func (n *rangeNode) stab(key []byte, out []*watcher) []*watcher {
	for n != nil {
		if !n.unbounded && bytes.Compare(n.maxEnd, key) <= 0 {
			return out // every range here ends at or before key
		}
		out = n.left.stab(key, out)
		if bytes.Compare(n.w.start, key) > 0 {
			return out // this range and those to its right start after key
		}
		if n.w.end == nil || bytes.Compare(key, n.w.end) < 0 {
			out = append(out, n.w)
		}
		n = n.right
	}
	return out
}

func (n *rangeNode) each(fn func(*watcher)) {
	if n == nil {
		return
	}
	n.left.each(fn)
	fn(n.w)
	n.right.each(fn)
}
