package shard

import "sync"

// Conn is the table's per-connection state. The caller allocates one per
// connection (NewConn) and passes it with every acquire that may queue;
// queued waiters are linked to it so that the table can cap them
// (Config.MaxWaitersPerConn) and DropConn can remove them in time
// proportional to that connection's own waiters. Tag is the caller's: the
// table never reads it; effects hand the Conn back so the caller can find
// its session through Tag.
type Conn struct {
	// Tag is opaque to the table (the engine stores its session here).
	Tag any

	// mu guards head, n, dropped, and the cnext/cprev/gen fields of every
	// waiter linked into this Conn. Lock order: shard.mu → Conn.mu; it is
	// never held while taking a shard lock.
	mu      sync.Mutex
	head    *waiter // circular list of this connection's queued waiters
	n       int     // len(list)
	dropped bool    // DropConn was called: refuse new waiters
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

// link appends w to c's list, or reports false if c was dropped or already
// has max waiters. The caller holds w's shard lock.
func (c *Conn) link(w *waiter, max int) bool {
	c.mu.Lock()
	if c.dropped || c.n >= max {
		c.mu.Unlock()
		return false
	}
	if c.head == nil {
		w.cnext, w.cprev = w, w
		c.head = w
	} else {
		tail := c.head.cprev
		w.cprev, w.cnext = tail, c.head
		tail.cnext = w
		c.head.cprev = w
	}
	c.n++
	c.mu.Unlock()
	return true
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
	c.n--
	c.mu.Unlock()
}

// dropRef is a DropConn snapshot of one waiter.
type dropRef struct {
	w     *waiter
	gen   uint64
	shard uint32
}

// snapshot marks c dropped and copies up to len(buf) of its waiters.
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
