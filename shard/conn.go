package shard

import "sync"

// Conn is the table's per-connection state. The caller allocates one per
// connection (NewConn) and passes it with every acquire that may queue and
// every watch; queued waiters and watches are linked to it so that the
// table can cap them (Config.MaxWaitersPerConn, Config.MaxWatchesPerConn)
// and DropConn can remove them in time proportional to that connection's
// own. Tag is the caller's: the table never reads it; effects hand the Conn
// back so the caller can find its session through Tag.
type Conn struct {
	// Tag is opaque to the table (the engine stores its session here).
	Tag any

	// mu guards head, n, nw, dropped, and the cnext/cprev/gen fields of
	// every waiter and watch linked into this Conn. Lock order: shard.mu →
	// Conn.mu; it is never held while taking a shard lock.
	mu      sync.Mutex
	head    *waiter // circular list of this connection's queued waiters and watches
	n       int     // queued waiters in the list
	nw      int     // watches in the list
	dropped bool    // DropConn was called: refuse new waiters and watches
}

// NewConn returns a Conn carrying tag.
func NewConn(tag any) *Conn { return &Conn{Tag: tag} }

// Waiters returns the number of acquires of c that are queued right now.
func (c *Conn) Waiters() int {
	c.mu.Lock()
	n := c.n
	c.mu.Unlock()
	return n
}

// Watches returns the number of watches of c registered right now.
func (c *Conn) Watches() int {
	c.mu.Lock()
	n := c.nw
	c.mu.Unlock()
	return n
}

// link appends the waiter w to c's list, or reports false if c was
// dropped or already has max waiters. The caller holds w's shard lock.
func (c *Conn) link(w *waiter, max int) bool {
	c.mu.Lock()
	if c.dropped || c.n >= max {
		c.mu.Unlock()
		return false
	}
	c.add(w)
	c.n++
	c.mu.Unlock()
	return true
}

// linkWatch is link for the watch w, bounded by max watches.
func (c *Conn) linkWatch(w *waiter, max int) bool {
	c.mu.Lock()
	if c.dropped || c.nw >= max {
		c.mu.Unlock()
		return false
	}
	c.add(w)
	c.nw++
	c.mu.Unlock()
	return true
}

// add appends w to c's list (c.mu held).
func (c *Conn) add(w *waiter) {
	if c.head == nil {
		w.cnext, w.cprev = w, w
		c.head = w
	} else {
		tail := c.head.cprev
		w.cprev, w.cnext = tail, c.head
		tail.cnext = w
		c.head.cprev = w
	}
}

// watchFull reports whether c refuses one more watch (dropped, or max
// watches already).
func (c *Conn) watchFull(max int) bool {
	c.mu.Lock()
	full := c.dropped || c.nw >= max
	c.mu.Unlock()
	return full
}

// unlink removes w from c's list and retires w's generation (so a DropConn
// snapshot taken earlier recognises it as gone). The caller holds w's shard
// lock.
func (c *Conn) unlink(w *waiter) {
	c.mu.Lock()
	if w.cnext == w {
		c.head = nil
	} else {
		w.cprev.cnext = w.cnext
		w.cnext.cprev = w.cprev
		if c.head == w {
			c.head = w.cnext
		}
	}
	w.cnext, w.cprev = nil, nil
	w.gen++
	if w.watch {
		c.nw--
	} else {
		c.n--
	}
	c.mu.Unlock()
}

// dropRef is a DropConn snapshot of one waiter or watch.
type dropRef struct {
	w     *waiter
	gen   uint64
	shard uint32
}

// snapshot marks c dropped and copies up to len(buf) of its waiters and
// watches.
func (c *Conn) snapshot(buf []dropRef) int {
	c.mu.Lock()
	c.dropped = true
	n := 0
	if w := c.head; w != nil {
		for n < len(buf) {
			buf[n] = dropRef{w: w, gen: w.gen, shard: w.shard}
			n++
			w = w.cnext
			if w == c.head {
				break
			}
		}
	}
	c.mu.Unlock()
	return n
}

// empty reports whether c has neither waiters nor watches.
func (c *Conn) empty() bool {
	c.mu.Lock()
	e := c.n == 0 && c.nw == 0
	c.mu.Unlock()
	return e
}
